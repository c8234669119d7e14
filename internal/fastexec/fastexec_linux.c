//go:build cgo && linux

// See fastexec.go. Runs before the Go runtime: plain C, no allocation
// beyond the stack, and every failure before execve leaves the process as
// it found it.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#define NSFS_MAGIC_ 0x6e736673

static int valid_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n <= 255 && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/');
}

// mount_like_iproute2 gives the process what `ip netns exec` gives: a new
// mount namespace, slave to the host's, a /sys for the current network
// namespace, and /etc/netns/NAME/* bound over /etc. Returns -1 on failure.
static int mount_like_iproute2(const char *name)
{
	char src[PATH_MAX], dst[PATH_MAX];
	struct statvfs vfs;
	unsigned long flags = 0;

	if (unshare(CLONE_NEWNS) < 0)
		return -1;
	if (mount("", "/", "none", MS_SLAVE | MS_REC, NULL) < 0)
		return -1;
	if (statvfs("/sys", &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
		flags = MS_RDONLY;
	umount2("/sys", MNT_DETACH);
	if (mount(name, "/sys", "sysfs", flags, NULL) < 0)
		return -1;
	snprintf(src, sizeof(src), "/etc/netns/%s", name);
	DIR *d = opendir(src);
	if (d == NULL)
		return 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(src, sizeof(src), "/etc/netns/%s/%s", name, e->d_name);
		snprintf(dst, sizeof(dst), "/etc/%s", e->d_name);
		if (mount(src, dst, "none", MS_BIND, NULL) < 0)
			fprintf(stderr, "nsfleet exec: bind %s -> %s failed: %s\n", src, dst, strerror(errno));
	}
	closedir(d);
	return 0;
}

__attribute__((constructor)) static void nsfleet_fastexec(int argc, char **argv, char **envp)
{
	const char *rundir = "/run/netns";
	int i = 1, mountns = 0;

	if (argc < 5 || argv == NULL)
		return;
	if (getenv("NSFLEET_NO_FASTEXEC"))
		return;
	if (strcmp(argv[i], "--run-dir") == 0 && i + 1 < argc) {
		rundir = argv[i + 1];
		i += 2;
	} else if (strncmp(argv[i], "--run-dir=", 10) == 0) {
		rundir = argv[i] + 10;
		i++;
	}
	if (i + 3 >= argc || strcmp(argv[i], "exec"))
		return;
	if (strcmp(argv[i + 1], "--mount-ns") == 0) {
		mountns = 1;
		i++;
	}
	if (i + 3 >= argc || strcmp(argv[i + 2], "--"))
		return;
	const char *name = argv[i + 1];
	char **cmd = &argv[i + 3];
	if (!valid_name(name) || cmd[0][0] == '\0')
		return;

	int dir = open(rundir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dir < 0)
		return;
	int ns = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	close(dir);
	if (ns < 0)
		return;
	struct statfs fs;
	if (fstatfs(ns, &fs) < 0 || fs.f_type != NSFS_MAGIC_) {
		close(ns);
		return;
	}
	int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	int homemnt = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC);
	if (home < 0 || homemnt < 0 || setns(ns, CLONE_NEWNET) < 0)
		goto out;
	if (!mountns || mount_like_iproute2(name) == 0)
		execvpe(cmd[0], cmd, envp);
	// Not found, not executable, or the mounts failed: go back and let the
	// Go code do it and report what went wrong. Never run Go in the wrong
	// namespaces.
	if (setns(home, CLONE_NEWNET) < 0 || (mountns && setns(homemnt, CLONE_NEWNS) < 0))
		_exit(125);
out:
	close(ns);
	if (home >= 0)
		close(home);
	if (homemnt >= 0)
		close(homemnt);
}
