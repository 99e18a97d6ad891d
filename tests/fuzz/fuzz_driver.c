/*
 * Plain driver for the fuzz targets when libFuzzer is not used: replays
 * every file given (directories are walked one level) through
 * LLVMFuzzerTestOneInput, then every truncation of it and a fixed number
 * of deterministic byte mutations, so the parsers see malformed input on
 * every `meson test` run.  Exit status 0 unless a target crashes.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUTATIONS 300
#define DRIVER_MAX_INPUT (1024 * 1024)

static unsigned long long rng = 0x9e3779b97f4a7c15ULL;

static unsigned next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng >> 16);
}

static void run_one(const uint8_t *data, size_t size)
{
	uint8_t *m = malloc(size + 8);

	if (!m)
		abort();
	LLVMFuzzerTestOneInput(data, size);
	for (size_t n = 0; n < size; n += 1 + size / 64)
		LLVMFuzzerTestOneInput(data, n);
	for (int i = 0; i < MUTATIONS; i++) {
		size_t n = size;

		memcpy(m, data, size);
		for (int k = 0; k < 1 + (int)(next_rand() % 4) && n; k++) {
			size_t at = next_rand() % n;

			switch (next_rand() % 4) {
			case 0:
				m[at] ^= (uint8_t)(1u << (next_rand() % 8));
				break;
			case 1:
				m[at] = (uint8_t)next_rand();
				break;
			case 2: {
				/* interesting values for lengths/numbers */
				static const uint8_t v[] = { 0, 0xff, 0x7f,
							     0x80, '0', '9',
							     '"', '-' };
				m[at] = v[next_rand() % sizeof(v)];
				break;
			}
			default:
				n = at; /* truncate */
				break;
			}
		}
		LLVMFuzzerTestOneInput(m, n);
	}
	free(m);
}

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	size_t n;

	if (!f) {
		perror(path);
		return 1;
	}
	buf = malloc(DRIVER_MAX_INPUT);
	if (!buf)
		abort();
	n = fread(buf, 1, DRIVER_MAX_INPUT, f);
	fclose(f);
	run_one(buf, n);
	free(buf);
	printf("ok %s (%zu bytes)\n", path, n);
	return 0;
}

int main(int argc, char **argv)
{
	int rc = 0, files = 0;

	for (int i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st) < 0) {
			perror(argv[i]);
			return 1;
		}
		if (S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;

			while (d && (e = readdir(d))) {
				char p[4096];

				if (e->d_name[0] == '.')
					continue;
				snprintf(p, sizeof(p), "%s/%s", argv[i],
					 e->d_name);
				rc |= run_file(p);
				files++;
			}
			if (d)
				closedir(d);
		} else {
			rc |= run_file(argv[i]);
			files++;
		}
	}
	printf("%d inputs\n", files);
	return rc || files == 0;
}
