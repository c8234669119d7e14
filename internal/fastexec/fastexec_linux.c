//go:build cgo && linux

// See fastexec.go. Runs before the Go runtime: plain C, no allocation
// beyond the stack, and every failure before execve leaves the process as
// it found it.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#define NSFS_MAGIC_ 0x6e736673

// valid_name is names.Namespace (internal/names) in C; fastexec_test.go
// holds the two to the same table.
int nsfleet_valid_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n <= 255 && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\n');
}

// skip_global_flag returns how many arguments at argv[i] are one of
// nsfleet's global flags (0 if argv[i] is none), storing --run-dir's value.
static int skip_global_flag(int argc, char **argv, int i, const char **rundir)
{
	const char *a = argv[i];
	if (!strcmp(a, "--run-dir") || !strcmp(a, "--workers") || !strcmp(a, "-w")) {
		if (i + 1 >= argc)
			return 0;
		if (!strcmp(a, "--run-dir"))
			*rundir = argv[i + 1];
		return 2;
	}
	if (!strncmp(a, "--run-dir=", 10)) {
		*rundir = a + 10;
		return 1;
	}
	if (!strncmp(a, "--workers=", 10) || (!strncmp(a, "-w", 2) && a[2] >= '0' && a[2] <= '9'))
		return 1;
	if (!strcmp(a, "-v") || !strcmp(a, "--verbose") || !strcmp(a, "--wait-lock"))
		return 1;
	return 0;
}

// parse_exec recognises every spelling of the fast path,
//
//	nsfleet [GLOBAL...] exec [GLOBAL...] [--] NAME [--] CMD [ARGS...]
//
// as cobra parses it (flags stop at NAME), and returns the index of CMD
// with *name set, or 0 for anything else: other flags of exec (--mount-ns,
// --all, --help) and other commands take the Go path.
static int parse_exec(int argc, char **argv, const char **rundir, const char **name)
{
	int i = 1, n;
	while (i < argc && (n = skip_global_flag(argc, argv, i, rundir)) > 0)
		i += n;
	if (i >= argc || strcmp(argv[i], "exec"))
		return 0;
	i++;
	while (i < argc && (n = skip_global_flag(argc, argv, i, rundir)) > 0)
		i += n;
	if (i < argc && !strcmp(argv[i], "--"))
		i++;
	else if (i < argc && argv[i][0] == '-')
		return 0;
	if (i >= argc)
		return 0;
	*name = argv[i++];
	if (i < argc && !strcmp(argv[i], "--"))
		i++;
	if (i >= argc || argv[i][0] == '\0')
		return 0;
	return i;
}

__attribute__((constructor)) static void nsfleet_fastexec(int argc, char **argv, char **envp)
{
	const char *rundir = "/run/netns", *name = NULL;

	if (argc < 3 || argv == NULL || getenv("NSFLEET_NO_FASTEXEC"))
		return;
	int c = parse_exec(argc, argv, &rundir, &name);
	if (c == 0 || !nsfleet_valid_name(name))
		return;
	char **cmd = &argv[c];

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
	if (home < 0 || setns(ns, CLONE_NEWNET) < 0)
		goto out;
	execvpe(cmd[0], cmd, envp);
	// Not found or not executable: go back and let the Go code do it and
	// report what went wrong. Never run Go in the wrong namespace.
	if (setns(home, CLONE_NEWNET) < 0)
		_exit(125);
out:
	close(ns);
	if (home >= 0)
		close(home);
}
