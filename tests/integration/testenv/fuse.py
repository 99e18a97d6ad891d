"""Is FUSE usable here?  (The skip marker's condition.)"""

import os
import shutil

NO_FUSE_TAG = "SBX-NO-FUSE"


def fuse_unusable_reason():
    """None when /dev/fuse can be opened and fusermount3 exists.

    SBX_TEST_NO_FUSE=1 pretends FUSE is unusable (to test the skip path).
    """
    if os.environ.get("SBX_TEST_NO_FUSE") == "1":
        return "SBX_TEST_NO_FUSE=1 is set"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return f"cannot open /dev/fuse: {e.strerror}"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt install fuse3)"
    return None
