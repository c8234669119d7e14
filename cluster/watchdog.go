package cluster

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// The watchdog fences a node whose agent stops running while the node
// does: a process stopped (SIGSTOP, a frozen thread, a long pause), or
// ended without a successor. The agent fences on its own clock, but only
// while its threads run; the watchdog is a process of its own, which the
// agent starts, and which sets the node's host veths down when the agent
// has not extended its deadline in time. The agent extends it after each
// lease renewal to the moment it would fence itself (the lease's earliest
// expiry minus the fence margin), so a paused agent is fenced at the same
// moment as one that lost etcd. A restarted agent connects to the
// watchdog that is running and extends it before that moment.
//
// The agent talks to it over an abstract unix socket named after the run
// dir (abstract sockets belong to the network namespace: one per node),
// and the watchdog takes orders only from root (SO_PEERCRED). Messages
// are lines: "extend MS" (fence if not extended again within MS), "veths
// NAME..." (the host veths to set down) and "tunnels JSON" (namespace to
// link-end interfaces: the tunnel ends among them are set down too).

// watchdogSlack is taken off every deadline for the time a message takes.
const watchdogSlack = 50 * time.Millisecond

// WatchdogAddr is the abstract socket of the watchdog of a run dir.
func WatchdogAddr(runDir string) string {
	h := sha256.Sum256([]byte(runDir))
	return "@nsfleet-watchdog-" + hex.EncodeToString(h[:8])
}

// RunWatchdog serves as the watchdog of runDir until ctx ends, or until it
// has fenced and no agent has come back for idle.
func RunWatchdog(ctx context.Context, runDir string, idle time.Duration, log *slog.Logger) error {
	addr := WatchdogAddr(runDir)
	ln, err := net.Listen("unix", addr)
	if err != nil {
		return fmt.Errorf("watchdog %s: %w", addr, err)
	}
	defer ln.Close()
	msgs := make(chan string, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !fromRoot(c) {
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				sc.Buffer(make([]byte, 64<<10), 16<<20)
				for sc.Scan() {
					msgs <- sc.Text()
				}
			}()
		}
	}()
	var veths []string
	var tunnels map[string][]string
	fire := time.NewTimer(time.Hour)
	fire.Stop()
	armed := false
	quiet := time.NewTimer(idle)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-quiet.C:
			if !armed {
				log.Info("watchdog: no agent extended the deadline; exiting")
				return nil
			}
			quiet.Reset(idle)
		case m := <-msgs:
			word, rest, _ := strings.Cut(m, " ")
			switch word {
			case "extend":
				ms, err := strconv.ParseInt(rest, 10, 64)
				if err != nil {
					continue
				}
				fire.Reset(max(time.Duration(ms)*time.Millisecond-watchdogSlack, 0))
				armed = true
				quiet.Reset(idle)
			case "veths":
				veths = strings.Fields(rest)
			case "tunnels":
				var t map[string][]string
				if json.Unmarshal([]byte(rest), &t) == nil {
					tunnels = t
				}
			}
		case <-fire.C:
			armed = false
			start := time.Now()
			n := setHostVethsDown(veths)
			down := 0
			if len(tunnels) > 0 {
				if rd, err := netns.OpenRunDir(runDir, false); err == nil {
					down = fleet.TunnelsDown(rd, tunnels)
				}
			}
			log.Warn("watchdog: the agent did not extend its deadline (stopped, or gone); host veths and tunnels set down",
				"veths_down", n, "tunnels_down", down, "took", time.Since(start))
		}
	}
}

func fromRoot(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	return err == nil && cred.Uid == 0
}

// setHostVethsDown sets the named links of this network namespace down
// and returns how many it set down.
func setHostVethsDown(names []string) int {
	host, err := rtnl.OpenLite()
	if err != nil {
		return 0
	}
	defer host.Close()
	n := 0
	for _, name := range names {
		if l, err := host.LinkByName(name); err == nil && l.Up {
			if host.SetUp(l.Index, false) == nil {
				n++
			}
		}
	}
	return n
}

// watchdogLink is the agent's end: it starts the watchdog if none runs,
// and sends it deadlines and the host veths to fence.
type watchdogLink struct {
	addr  string
	start func() error // starts the watchdog process
	log   *slog.Logger

	mu      sync.Mutex
	conn    net.Conn
	veths   string // as last sent
	tunnels string // as last sent
	warned  bool
}

// connect reaches the running watchdog or starts one and waits for it.
func (w *watchdogLink) connect() error {
	if w.conn != nil {
		return nil
	}
	c, err := net.Dial("unix", w.addr)
	if err != nil {
		if err := w.start(); err != nil {
			return err
		}
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if c, err = net.Dial("unix", w.addr); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("watchdog did not start: %w", err)
		}
	}
	w.conn = c
	w.veths, w.tunnels = "", ""
	return nil
}

func (w *watchdogLink) send(line string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for try := 0; try < 2; try++ {
		err := w.connect()
		if err == nil {
			w.conn.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err = w.conn.Write([]byte(line + "\n")); err == nil {
				w.warned = false
				return
			}
			w.conn.Close()
			w.conn = nil
		}
		if try == 1 && !w.warned {
			w.warned = true
			w.log.Error("watchdog unreachable: a paused agent would not be fenced", "err", err)
		}
	}
}

// extend tells the watchdog to fence unless extended again within d.
func (w *watchdogLink) extend(d time.Duration) {
	w.send("extend " + strconv.FormatInt(max(d, 0).Milliseconds(), 10))
}

// setVeths tells the watchdog which host veths to set down.
func (w *watchdogLink) setVeths(names []string) {
	if w == nil {
		return
	}
	w.sendNew(&w.veths, "veths "+strings.Join(names, " "))
}

// setTunnels tells the watchdog which link ends of which namespaces to
// set down if they are tunnel ends.
func (w *watchdogLink) setTunnels(ends map[string][]string) {
	if w == nil {
		return
	}
	b, _ := json.Marshal(ends)
	w.sendNew(&w.tunnels, "tunnels "+string(b))
}

// sendNew sends line unless it is what *last says was sent.
func (w *watchdogLink) sendNew(last *string, line string) {
	w.mu.Lock()
	same := *last == line
	w.mu.Unlock()
	if same {
		return
	}
	w.send(line)
	w.mu.Lock()
	*last = line
	w.mu.Unlock()
}

func (w *watchdogLink) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
}

// startWatchdogProcess starts this executable as the watchdog of runDir:
// its own session, in this network and mount namespace, output appended to
// logPath.
func startWatchdogProcess(runDir, logPath string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(self, "__watchdog", "--run-dir", runDir)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
