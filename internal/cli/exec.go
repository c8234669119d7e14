package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/spf13/cobra"
)

func newExec(g *globals) *cobra.Command {
	var all, mountNS bool
	var file, prefix string
	var parallel int
	cmd := &cobra.Command{
		Use:   "exec [--mount-ns] NAME -- CMD [ARGS...] | exec --all (-f SPEC | --prefix P) -- CMD [ARGS...]",
		Short: "Run a command inside a namespace (or all of them) without the mount-namespace tax",
		Long: `exec runs CMD inside the network namespace NAME. By default it only enters
the network namespace and execs CMD in place (setns, then execve: CMD takes
over nsfleet's process, before the Go runtime even starts): no mount
namespace is made, so its cost does not grow with the number of namespaces,
unlike 'ip netns exec'. Stdin, stdout and stderr pass through, signals reach
CMD directly, and the exit code is CMD's own.

--mount-ns gives CMD exactly what 'ip netns exec' gives: a new mount
namespace, a /sys that shows the namespace's devices, and the files of
/etc/netns/NAME bound over /etc. Use it for programs that read /sys/class/net
or need per-namespace /etc/resolv.conf.

--all runs CMD in every namespace a spec names (or whose name starts with a
prefix), --parallel at a time, prefixing each output line with the namespace's
name, and ends with a summary of exit codes.`,
		Example: `  nsfleet exec bar-17 -- ip addr
  nsfleet exec bar-17 -- ping -c1 198.18.0.1
  nsfleet exec --mount-ns bar-17 -- ls /sys/class/net
  nsfleet exec --all --prefix bar- -- sysctl -n net.ipv4.ip_forward`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Flags stop at NAME (so CMD's own flags are left alone); the
			// "--" before CMD is then still in args.
			dashless := func(a []string) []string {
				if len(a) > 0 && a[0] == "--" {
					return a[1:]
				}
				return a
			}
			if err := needRoot("exec"); err != nil {
				return err
			}
			rd, err := netns.OpenRunDir(g.runDir, false)
			if err != nil {
				return fmt.Errorf("exec: %w", err)
			}
			if all {
				if (file == "") == (prefix == "") {
					return usageError{Err: fmt.Errorf("exec --all: give exactly one of -f SPEC or --prefix P")}
				}
				if args = dashless(args); len(args) == 0 {
					return usageError{Err: fmt.Errorf("exec --all: want -- CMD [ARGS...]")}
				}
				return execAll(cmd.Context(), g, rd, file, prefix, parallel, mountNS, args)
			}
			if file != "" || prefix != "" {
				return usageError{Err: fmt.Errorf("exec: -f and --prefix go with --all")}
			}
			argv := dashless(args[1:])
			if len(argv) == 0 {
				return usageError{Err: fmt.Errorf("exec: want NAME -- CMD [ARGS...]")}
			}
			code, err := execOne(g, rd, args[0], argv, mountNS)
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().BoolVar(&mountNS, "mount-ns", false, "also a new mount namespace with /sys and /etc/netns/NAME, as 'ip netns exec'")
	cmd.Flags().BoolVar(&all, "all", false, "run in every namespace that -f or --prefix selects")
	cmd.Flags().StringVarP(&file, "file", "f", "", "with --all: the spec's namespaces")
	cmd.Flags().StringVar(&prefix, "prefix", "", "with --all: namespaces whose names start with P")
	cmd.Flags().IntVar(&parallel, "parallel", 16, "with --all: how many commands run at once")
	return cmd
}

// forwarded are the signals exec passes on to a --mount-ns command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// execOne runs argv in the namespace called name. Without --mount-ns it
// enters the namespace and execs argv in place (as the fastexec
// constructor does before the Go runtime starts, when it can): argv takes
// over nsfleet's process, so its exit status and the signals it gets are
// its own. With --mount-ns, the helper process is started and waited for,
// and signals sent to nsfleet are passed on.
func execOne(g *globals, rd *netns.RunDir, name string, argv []string, mountNS bool) (int, error) {
	h, err := rd.Open(name)
	if err != nil {
		return 0, fmt.Errorf("exec: %s: %w", name, err)
	}
	defer h.Close()
	if !mountNS {
		path, err := exec.LookPath(argv[0])
		if err != nil {
			return 0, fmt.Errorf("exec: %s: %w", name, err)
		}
		err = netns.Do(h, func() error { return syscall.Exec(path, argv, os.Environ()) })
		return 0, fmt.Errorf("exec: %s: %s: %w", name, argv[0], err)
	}
	c, err := process.Command(argv, process.Options{MountNS: true, Name: name})
	if err != nil {
		return 0, fmt.Errorf("exec: %s: %w", name, err)
	}
	c.Stdout, c.Stderr = g.stdout, g.stderr
	if f, ok := g.stdout.(*os.File); ok {
		c.Stdout = f
	}
	if f, ok := g.stderr.(*os.File); ok {
		c.Stderr = f
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if err := process.Start(h, c); err != nil {
		return 0, fmt.Errorf("exec: %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				c.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	werr := c.Wait()
	close(done)
	code, err := process.ExitCode(werr)
	if err != nil {
		return 0, fmt.Errorf("exec: %s: %w", name, err)
	}
	return code, nil
}

func execAll(ctx context.Context, g *globals, rd *netns.RunDir, file, prefix string, parallel int, mountNS bool, argv []string) error {
	var names []string
	if file != "" {
		f, err := loadSpec(file)
		if err != nil {
			return err
		}
		names = f.Names()
	} else {
		pins, err := rd.List()
		if err != nil {
			return fmt.Errorf("exec: %w", err)
		}
		for _, p := range pins {
			if strings.HasPrefix(p.Name, prefix) && p.Mounted {
				names = append(names, p.Name)
			}
		}
	}
	if len(names) == 0 {
		return &exitError{Code: exitcode.Failed, Err: fmt.Errorf("exec --all: no namespace matches")}
	}
	if parallel < 1 {
		parallel = 1
	}
	var outMu sync.Mutex
	codes := make([]int, len(names))
	errs := make([]error, len(names))
	pool.Each(ctx, len(names), pool.Fit(parallel, fdsPerExec), func(i int) {
		codes[i], errs[i] = execPrefixed(rd, names[i], argv, mountNS, g.stdout, g.stderr, &outMu)
	})
	byCode := map[int]int{}
	failed := 0
	for i := range names {
		if errs[i] != nil {
			fmt.Fprintf(g.stderr, "exec: %s: %v\n", names[i], errs[i])
			failed++
			continue
		}
		byCode[codes[i]]++
	}
	var parts []string
	keys := make([]int, 0, len(byCode))
	for k := range byCode {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d exited %d", byCode[k], k))
	}
	if failed > 0 {
		parts = append(parts, fmt.Sprintf("%d could not start", failed))
	}
	if ctx.Err() != nil {
		parts = append(parts, "interrupted")
	}
	fmt.Fprintf(g.stderr, "exec: %d namespaces: %s\n", len(names), strings.Join(parts, ", "))
	if ctx.Err() != nil {
		return &exitError{Code: exitcode.Interrupted}
	}
	if failed > 0 || len(keys) > 1 || (len(keys) == 1 && keys[0] != 0) {
		return &exitError{Code: exitcode.Failed}
	}
	return nil
}

// fdsPerExec is what one command of exec --all holds at once in nsfleet:
// the pin, three pipes, exec's own status pipe, a pidfd, and netns.Do's
// handle on the original namespace.
const fdsPerExec = 12

// execPrefixed runs argv in one namespace with its output lines prefixed.
func execPrefixed(rd *netns.RunDir, name string, argv []string, mountNS bool, stdout, stderr io.Writer, mu *sync.Mutex) (int, error) {
	h, err := rd.Open(name)
	if err != nil {
		return 0, err
	}
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	var copies sync.WaitGroup
	for _, p := range []struct {
		r *io.PipeReader
		w io.Writer
	}{{outR, stdout}, {errR, stderr}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			sc := bufio.NewScanner(p.r)
			sc.Buffer(make([]byte, 64*1024), 1024*1024)
			for sc.Scan() {
				mu.Lock()
				fmt.Fprintf(p.w, "%s: %s\n", name, sc.Text())
				mu.Unlock()
			}
			io.Copy(io.Discard, p.r)
		}()
	}
	// A Cmd that failed to start cannot be started again: build it anew
	// for each try.
	c, err := pool.RetryValue(func() (*exec.Cmd, error) {
		c, err := process.Command(argv, process.Options{MountNS: mountNS, Name: name, Stdin: strings.NewReader(""), Stdout: outW, Stderr: errW, DieWithParent: true})
		if err != nil {
			return nil, err
		}
		return c, process.Start(h, c)
	})
	h.Close()
	if err != nil {
		outW.Close()
		errW.Close()
		copies.Wait()
		return 0, err
	}
	werr := c.Wait()
	outW.Close()
	errW.Close()
	copies.Wait()
	return process.ExitCode(werr)
}
