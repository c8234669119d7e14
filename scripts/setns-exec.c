/* The floor for any "run CMD in a namespace" command: open the pin, setns,
 * execvp, nothing else. scripts/perf-exec.sh builds it (gcc -static) to show
 * how close nsfleet exec comes to it. Usage: setns-exec PIN CMD [ARGS...] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
		perror(argv[1]);
		return 1;
	}
	execvp(argv[2], &argv[2]);
	perror(argv[2]);
	return 127;
}
