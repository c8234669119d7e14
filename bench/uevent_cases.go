package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
	"gonum.org/v1/gonum/stat/distuv"
)

// The report's own three cases (report 001): uevents injected into each of
// K network namespaces, as a privileged process may since Linux 4.17 (a
// message sent on a NETLINK_KOBJECT_UEVENT socket opened inside the
// namespace is broadcast there with a sequence number; the send returns
// when the broadcast is done, and is what is timed):
//
//	thread-1  K namespaces owned by a user namespace, each with a listener
//	thread-2  K/2 of those and K/2 owned by the initial user namespace
//	thread-3  the same K without listeners
//
// The report made one user namespace per network namespace; here all the
// userns-owned ones share one (what the kernel's code looks at is whether
// the owner is the initial user namespace, not which one it is).
var ueventReportCases = map[string]struct {
	userns, initOwned float64 // fractions of K
	listen            bool
}{
	"thread-1": {1, 0, true},
	"thread-2": {0.5, 0.5, true},
	"thread-3": {0.5, 0.5, false},
}

// reportCase runs one case: namespaces made, one injector socket inside
// each, N injections round-robin over them.
func (u uevent) reportCase(ctx context.Context, o Options, variant string, cfg map[string]string, rep int, run *Run) error {
	c := ueventReportCases[variant]
	k := UeventNamespaces
	nUser := int(math.Round(float64(k) * c.userns))
	nInit := k - nUser
	var targets []*netns.NS
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	if nUser > 0 {
		stop, nss, err := usernsNamespaces(ctx, nUser, c.listen)
		if err != nil {
			return err
		}
		closers = append(closers, stop)
		targets = append(targets, nss...)
	}
	var listeners []int
	closers = append(closers, func() {
		for _, s := range listeners {
			unix.Close(s)
		}
	})
	for i := 0; i < nInit; i++ {
		h, err := listenerNamespace(c.listen, &listeners)
		if err != nil {
			return err
		}
		closers = append(closers, func() { h.Close() })
		targets = append(targets, h)
	}
	// One injector per namespace, opened inside it.
	injectors := make([]int, len(targets))
	for i, h := range targets {
		err := netns.Do(h, func() error {
			s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
			injectors[i] = s
			return err
		})
		if err != nil {
			return fmt.Errorf("injector: %w", err)
		}
		s := injectors[i]
		closers = append(closers, func() { unix.Close(s) })
	}
	msg := ueventMessage("change@/devices/virtual/net/lo", "ACTION=change", "DEVPATH=/devices/virtual/net/lo", "SUBSYSTEM=net", "INTERFACE=lo")
	kernel := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	ds := make([]float64, 0, o.N)
	for i := 0; i < o.N; i++ {
		if i%1000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		s := injectors[i%len(injectors)]
		t := time.Now()
		if err := unix.Sendto(s, msg, 0, kernel); err != nil {
			if i == 0 {
				return fmt.Errorf("inject a uevent into a namespace: %w (needs Linux 4.17 or later)", err)
			}
			return err
		}
		ds = append(ds, float64(time.Since(t).Nanoseconds())/1e3)
		if i%1000 == 999 {
			drain(listeners)
		}
	}
	mean, half := meanCI(ds, 0.95)
	add := func(metric string, v float64) {
		run.Samples = append(run.Samples, Sample{Config: cfg, Metric: metric, Unit: "us", Better: "lower", Rep: rep, Value: v})
	}
	sort.Float64s(ds)
	add("transaction time mean", mean)
	add("transaction time mean 95% CI half-width", half)
	add("transaction time p50", ds[len(ds)/2])
	add("transaction time p90", ds[len(ds)*9/10])
	add("transaction time p99", ds[len(ds)*99/100])
	return nil
}

// ueventMessage builds the netlink message whose payload is a uevent:
// "ACTION@DEVPATH" and KEY=VALUE strings, each NUL-terminated.
func ueventMessage(parts ...string) []byte {
	var payload []byte
	for _, p := range parts {
		payload = append(payload, p...)
		payload = append(payload, 0)
	}
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(payload))
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.NLMSG_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(b[4:6], unix.NLMSG_MIN_TYPE)
	binary.NativeEndian.PutUint16(b[6:8], unix.NLM_F_REQUEST)
	return append(b, payload...)
}

// meanCI returns the mean and the half-width of its confidence interval
// (Student t, as the report's Welch tests assume per sample).
func meanCI(xs []float64, level float64) (float64, float64) {
	n := float64(len(xs))
	if n < 2 {
		return 0, 0
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	mean := sum / n
	ss := 0.0
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / (n - 1))
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: n - 1}.Quantile(0.5 + level/2)
	return mean, t * sd / math.Sqrt(n)
}
