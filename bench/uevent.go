package bench

import (
	"bufio"
	"context"
	"fmt"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// uevent reproduces report 001 (docs/BACKGROUND.md): a kernel uevent is broadcast to the
// uevent listeners of every network namespace owned by the initial user
// namespace, under one mutex, so its cost grows with the namespaces that
// listen. K namespaces get a NETLINK_KOBJECT_UEVENT listener each (or
// none); then N "change" uevents are injected on a veth of the scenario's
// own, and each injection (a write to its uevent file, which returns when
// the broadcast is done) is timed.
type uevent struct{}

func init() {
	register(&Scenario{
		Name:     "uevent",
		Describe: "report 001: inject N uevents with K namespaces (--namespaces) listening or not; transaction time mean and percentiles",
		N:        10000,
		Mark:     10000,
		Engines:  []string{"native"},
		Variants: []string{"listeners", "userns-listeners", "no-listeners", "thread-1", "thread-2", "thread-3"},
		Keys:     []string{"listeners"},
		Run:      uevent{}.Run,
	})
}

// UeventNamespaces is K.
var UeventNamespaces = 100

func (u uevent) Run(ctx context.Context, o Options, run *Run) error {
	variants := o.Variants
	run.Params["namespaces"] = fmt.Sprint(UeventNamespaces)
	run.Notes = append(run.Notes, "uevents are injected on a veth the scenario makes in nsfleet's namespace (name "+o.Prefix+"u0) and removes afterwards",
		"userns-listeners: the K namespaces (and their listeners) are owned by a user namespace of their own; the kernel sends them no untagged uevents",
		"thread-1/2/3: the report's cases, N uevents injected round-robin INTO each of the K namespaces (sent on a NETLINK_KOBJECT_UEVENT socket opened inside it, Linux 4.17+): 1) all owned by a user namespace, with listeners; 2) half userns-owned, half init-owned, with listeners; 3) as 2 without listeners. The report used K=1000 and 10,000 per namespace (-n 10000000 --namespaces 1000); its userns-owned namespaces had one user namespace each, here they share one")
	host, err := rtnl.OpenLite()
	if err != nil {
		return err
	}
	defer host.Close()
	self, err := netns.Current()
	if err != nil {
		return err
	}
	defer self.Close()
	dev := o.Prefix + "u0"
	if err := host.AddVeth(rtnl.VethPair{Host: dev, Peer: o.Prefix + "u1", PeerNsFd: self.Fd()}); err != nil {
		return err
	}
	defer func() {
		if l, err := host.LinkByName(dev); err == nil {
			host.DeleteLink(l.Index)
		}
	}()
	for _, v := range variants {
		for rep := 0; rep < o.Runs; rep++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg := map[string]string{"listeners": map[string]string{"listeners": fmt.Sprint(UeventNamespaces), "userns-listeners": fmt.Sprint(UeventNamespaces) + "-in-userns", "no-listeners": "0"}[v]}
			o.Log.Info("run", "variant", v, "rep", rep+1)
			if _, ok := ueventReportCases[v]; ok {
				cfg = map[string]string{"listeners": v}
				if err := u.reportCase(ctx, o, v, cfg, rep, run); err != nil {
					return fmt.Errorf("variant=%s: %w", v, err)
				}
				continue
			}
			if v == "userns-listeners" {
				stop, err := usernsListeners(ctx, UeventNamespaces)
				if err != nil {
					run.Skipped = append(run.Skipped, "variant=userns-listeners: "+err.Error())
					break
				}
				err = u.once(ctx, o, dev, false, cfg, rep, run)
				stop()
				if err != nil {
					return err
				}
				continue
			}
			if err := u.once(ctx, o, dev, v == "listeners", cfg, rep, run); err != nil {
				return err
			}
		}
	}
	return nil
}

func (u uevent) once(ctx context.Context, o Options, dev string, listen bool, cfg map[string]string, rep int, run *Run) error {
	var held []*netns.NS
	var socks []int
	defer func() {
		for _, s := range socks {
			unix.Close(s)
		}
		for _, h := range held {
			h.Close()
		}
	}()
	for i := 0; i < UeventNamespaces; i++ {
		h, err := listenerNamespace(listen, &socks)
		if err != nil {
			return err
		}
		held = append(held, h)
	}
	f, err := os.OpenFile("/sys/class/net/"+dev+"/uevent", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ds := make([]float64, 0, o.N)
	for i := 0; i < o.N; i++ {
		if i%1000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.Now()
		if _, err := f.Write([]byte("change")); err != nil {
			return fmt.Errorf("inject uevent: %w", err)
		}
		ds = append(ds, float64(time.Since(t).Nanoseconds())/1e3)
		if i%1000 == 999 {
			drain(socks)
		}
	}
	sort.Float64s(ds)
	sum := 0.0
	for _, d := range ds {
		sum += d
	}
	add := func(metric string, v float64) {
		run.Samples = append(run.Samples, Sample{Config: cfg, Metric: metric, Unit: "us", Better: "lower", Rep: rep, Value: v})
	}
	add("transaction time mean", sum/float64(len(ds)))
	add("transaction time p50", ds[len(ds)/2])
	add("transaction time p90", ds[len(ds)*9/10])
	add("transaction time p99", ds[len(ds)*99/100])
	return nil
}

// listenerNamespace makes a network namespace owned by this process's user
// namespace, with a bound, non-blocking uevent listener (added to socks)
// when listen.
func listenerNamespace(listen bool, socks *[]int) (*netns.NS, error) {
	h, err := netns.Create(func(*netns.NS) error {
		if !listen {
			return nil
		}
		s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
		if err != nil {
			return err
		}
		*socks = append(*socks, s)
		return unix.Bind(s, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1})
	})
	if err != nil {
		return nil, fmt.Errorf("listener namespace: %w", err)
	}
	return h, nil
}

// drain empties the listeners' queues so they keep receiving (a full
// queue drops, which is cheaper than delivering and would flatter the
// numbers).
func drain(socks []int) {
	buf := make([]byte, 8192)
	for _, s := range socks {
		for {
			if _, _, err := unix.Recvfrom(s, buf, unix.MSG_DONTWAIT); err != nil {
				break
			}
		}
	}
}

// drainWait waits up to 100 ms for any of socks to have data, then drains.
func drainWait(socks []int) {
	if len(socks) == 0 {
		time.Sleep(time.Second)
		return
	}
	fds := make([]unix.PollFd, len(socks))
	for i, s := range socks {
		fds[i] = unix.PollFd{Fd: int32(s), Events: unix.POLLIN}
	}
	unix.Poll(fds, 100)
	drain(socks)
}

// UeventHelperArg makes nsfleet (or a test binary) hold K listening
// namespaces in a user namespace of its own.
const UeventHelperArg = "__nsfleet-uevent-helper"

// usernsListeners starts the helper and waits until its K namespaces listen.
func usernsListeners(ctx context.Context, k int) (stop func(), err error) {
	stop, _, err = usernsNamespaces(ctx, k, true)
	return stop, err
}

// usernsNamespaces starts the helper with K network namespaces owned by a
// user namespace of its own, each with a bound uevent listener or none,
// and returns handles on them (opened through the helper's descriptors).
func usernsNamespaces(ctx context.Context, k int, listen bool) (stop func(), nss []*netns.NS, err error) {
	mode := "listen"
	if !listen {
		mode = "quiet"
	}
	cmd := exec.CommandContext(ctx, "/proc/self/exe", UeventHelperArg, fmt.Sprint(k), mode)
	cmd.SysProcAttr = ownUserNamespace()
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("user namespace helper: %w", err)
	}
	stop = func() {
		for _, h := range nss {
			h.Close()
		}
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	fields := strings.Fields(line)
	if err != nil || len(fields) == 0 || fields[0] != "ready" {
		stop()
		return nil, nil, fmt.Errorf("user namespace helper: %q %v", line, err)
	}
	for _, fd := range fields[1:] {
		h, err := netns.OpenPath(fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, fd))
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("user namespace helper's namespace: %w", err)
		}
		nss = append(nss, h)
	}
	return stop, nss, nil
}

// UeventHelperMain holds K network namespaces, each with a bound uevent
// socket, on one thread, until stdin closes.
func init() { reexec.Register(UeventHelperArg, UeventHelperMain) }

func UeventHelperMain(args []string) {
	k, err := strconv.Atoi(args[0])
	if err != nil || k < 1 {
		os.Exit(2)
	}
	listen := len(args) < 2 || args[1] != "quiet"
	runtime.LockOSThread()
	var fds []string
	var socks []int
	for i := 0; i < k; i++ {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			fmt.Println("unshare:", err)
			os.Exit(1)
		}
		// Held open, the descriptor keeps the namespace alive after the
		// next unshare and lets the parent open it (/proc/PID/fd/N).
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY, 0)
		if err != nil {
			fmt.Println("open namespace:", err)
			os.Exit(1)
		}
		fds = append(fds, strconv.Itoa(fd))
		if !listen {
			continue
		}
		s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
		if err == nil {
			err = unix.Bind(s, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1})
		}
		if err != nil {
			fmt.Println("listener:", err)
			os.Exit(1)
		}
		socks = append(socks, s)
	}
	// Read what arrives, as a real listener does: a full queue drops
	// messages, which costs the sender less and would flatter the numbers.
	go func() {
		for {
			drainWait(socks)
		}
	}()
	fmt.Println("ready", strings.Join(fds, " "))
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}
