/*
 * The floor for removing a fleet: unmount and unlink every pin in a run dir,
 * nothing else (no ownership check, no process stop, no waiting). Used by
 * scripts/scale.sh as the baseline for `nsfleet down`.
 *
 *   bulk-unpin RUNDIR
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s RUNDIR\n", argv[0]);
		return 2;
	}
	DIR *d = opendir(argv[1]);
	if (d == NULL) {
		perror(argv[1]);
		return 1;
	}
	int dfd = dirfd(d), n = 0, failed = 0;
	char path[4096];
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
		if (umount2(path, MNT_DETACH) < 0 && errno != EINVAL) {
			perror(path);
			failed++;
			continue;
		}
		if (unlinkat(dfd, e->d_name, 0) < 0) {
			perror(path);
			failed++;
			continue;
		}
		n++;
	}
	closedir(d);
	fprintf(stderr, "bulk-unpin: %d removed, %d failed\n", n, failed);
	return failed > 0;
}
