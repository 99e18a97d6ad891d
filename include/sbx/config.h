/*
 * Configuration: one merged JSON object.
 *
 * Layers, in increasing priority (later ones win, objects merge key by key):
 *   1. built-in defaults (sbx_config_defaults())
 *   2. the user file: $XDG_CONFIG_HOME/sbx/config.json, else
 *      ~/.config/sbx/config.json                      (optional)
 *   3. the "sandbox" section of opencode.json, then of opencode.jsonc, at
 *      the top of the git repository of opts.repo (or the working
 *      directory)                                      (optional)
 *   4. the file named by $SBX_CONFIG                   (must exist if set)
 *   5. opts.config_file (sbx --config FILE)            (must exist if set)
 *   6. opts.flags, built by the CLI from its options   (source "command line")
 *
 * Shape (every key optional):
 *   {"provider": "local" | "remote" | "kubernetes" | "modal",
 *    "mount_root": "~/sbx",
 *    "local": {"isolation": "none" | "bwrap", "network": true},
 *    "mount": {"allow_other": false},
 *    "remote": {...}, "kubernetes": {...}, "modal": {...}}
 * Files are JSONC (comments and trailing commas allowed).  Unknown keys are
 * ignored so that newer files work with older sbx.  Each layer is validated
 * on its own before it is merged, so an error names the file that holds the
 * bad value: -EINVAL (SBX_ERR_CONFIG) "FILE: \"key\" must be ...".
 *
 * Ownership: *out trees belong to the caller (cJSON_Delete()).  Getters
 * return borrowed pointers into the tree.  No global state; thread-safe.
 */
#ifndef SBX_CONFIG_H
#define SBX_CONFIG_H

#include <stdbool.h>

#include "sbx/error.h"

struct cJSON;

struct sbx_config_opts {
	const char *repo;        /* directory inside the repository whose
				  * opencode.json(c) applies; NULL: cwd */
	const char *config_file; /* --config FILE, or NULL */
	const struct cJSON *flags; /* command-line overlay (borrowed) or NULL */
	bool skip_user;          /* do not read the user file (tests) */
};

/* The built-in defaults (a new tree; caller frees). */
struct cJSON *sbx_config_defaults(void);

/*
 * Load and merge all layers.  Errors: -EINVAL (CONFIG) for a bad value or
 * bad JSON (the message names file, line or key); -ENOENT (CONFIG) when
 * $SBX_CONFIG or --config names a missing file; -errno (OS) for unreadable
 * files.  *out is NULL on error.
 */
SBX_WUR int sbx_config_load(struct cJSON **out,
			    const struct sbx_config_opts *o);

/*
 * Validate one layer (see the shape above).  `source` names it in
 * messages.  -EINVAL (CONFIG).
 */
SBX_WUR int sbx_config_validate(const struct cJSON *layer,
				const char *source);

/* Provider names the configuration accepts, NULL-terminated. */
const char *const *sbx_config_provider_names(void);

/* The configured provider name ("local" when unset).  Borrowed. */
const char *sbx_config_provider(const struct cJSON *cfg);

/* The section of provider `name` (cfg[name]), or NULL.  Borrowed. */
const struct cJSON *sbx_config_section(const struct cJSON *cfg,
				       const char *name);

/*
 * Where mounts go by default: $SBX_MOUNT_ROOT if set, else cfg
 * "mount_root", else ~/sbx; "~" expanded, absolute.  Not created.  *out
 * malloc'd.
 */
SBX_WUR int sbx_config_mount_root(char **out, const struct cJSON *cfg);

/*
 * "mount": {"allow_other": true}: mount so that other users may use the
 * mount (false when unset).
 */
bool sbx_config_allow_other(const struct cJSON *cfg);

#endif
