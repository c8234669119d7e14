package process

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

// Store keeps what nsfleet intended for each supervised process: a record
// (PID, start time, namespace, restarts) and a log file, under one
// directory per run dir. The kernel stays the truth: a record only counts
// while /proc shows the same PID with the same start time in the same
// network namespace, so a reused PID is never mistaken for a daemon.
type Store struct {
	Dir string
}

// StoreFor returns the store that belongs to a run dir: beside it, as
// .nsfleet-<name> (for /run/netns, /run/.nsfleet-netns).
func StoreFor(rd *netns.RunDir) *Store {
	return &Store{Dir: filepath.Join(filepath.Dir(rd.Path), ".nsfleet-"+filepath.Base(rd.Path))}
}

// Record is one supervised process as nsfleet started it.
type Record struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	PID       int       `json:"pid"`
	StartTime uint64    `json:"start_time"` // /proc/PID/stat field 22, clock ticks since boot
	NetNS     uint64    `json:"netns"`      // inode of the namespace it runs in
	Restarts  int       `json:"restarts"`
	Started   time.Time `json:"started"`
	Command   []string  `json:"command"`
	// Spec fingerprints the process's whole spec (command, user,
	// capabilities, ...) as launched: a record whose fingerprint differs
	// from the spec's is a process to restart (see Changed).
	Spec string `json:"spec,omitempty"`
	// Stopped is set by Stop before it signals the process: a supervisor
	// never restarts a stopped process (up starts it again).
	Stopped bool `json:"stopped,omitempty"`
	// Launching is set while the process is being started, before its PID
	// is known. A record still launching when read means nsfleet died in
	// between: Load then looks for the process by its marker (see Launch).
	Launching bool `json:"launching,omitempty"`
	// Launcher and LauncherStart name the process that is launching
	// (with Launching): while it lives, the launch is in progress, not
	// cut short, and nobody else may recover or repeat it.
	Launcher      int    `json:"launcher,omitempty"`
	LauncherStart uint64 `json:"launcher_start,omitempty"`
}

// launchInProgress reports whether r is a launch whose launcher is still
// running (as opposed to one a crash cut short).
func launchInProgress(r *Record) bool {
	if !r.Launching || r.Launcher <= 0 {
		return false
	}
	start, state, err := procStart(r.Launcher)
	return err == nil && state != 'Z' && start == r.LauncherStart
}

// MarkerEnv is the environment variable Launch gives every process, naming
// its store, namespace and name: how a process whose launch was cut short
// by a crash is found again instead of being started twice.
const MarkerEnv = "NSFLEET_PROCESS"

func (s *Store) marker(ns, name string) string {
	return MarkerEnv + "=" + s.Dir + ":" + ns + "/" + name
}

// recoverLaunch finds the process a cut-short launch started, by its
// marker, and records it (with save); with none found, the record is
// marked not running (PID 0), so it will be started. Only the supervisor
// saves: a reader (ls, a stop) may meet a launch in progress, not cut
// short, and saving PID 0 over the launcher's record would orphan the
// process it is starting.
func (s *Store) recoverLaunch(r *Record, save bool) (*Record, error) {
	want := []byte(s.marker(r.Namespace, r.Name) + "\x00")
	ents, _ := os.ReadDir("/proc")
	r.Launching, r.PID = false, 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, want...)) {
			continue
		}
		start, state, err := procStart(pid)
		if err != nil || state == 'Z' {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue
		}
		r.PID, r.StartTime, r.NetNS = pid, start, st.Ino
		break
	}
	if !save {
		return r, nil
	}
	return r, s.Save(r)
}

func (s *Store) recordPath(ns, name string) string {
	return filepath.Join(s.Dir, "procs", ns, name+".json")
}

// LogPath is where the process's stdout and stderr go.
func (s *Store) LogPath(ns, name string) string {
	return filepath.Join(s.Dir, "logs", ns, name+".log")
}

// ConfigPath is where the process's config (spec.Process.Config) is
// written before each start.
func (s *Store) ConfigPath(ns, name string) string {
	return filepath.Join(s.Dir, "configs", ns, name+".conf")
}

// writeConfig writes p's config where its command names it, and returns
// the command with that path in place of spec.ConfigPlaceholder. The file
// is replaced whole (a daemon never reads half of it); it is readable by
// root and by the user and group the daemon runs as, no one else (a
// config may hold keys), and the directories above it in the store can be
// passed through but not listed.
func (s *Store) writeConfig(nsName string, p spec.Process) ([]string, error) {
	if p.Config == "" {
		return p.Command, nil
	}
	path := s.ConfigPath(nsName, p.Name)
	for _, d := range []string{s.Dir, filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, err
		}
	}
	uid, gid, _, set, err := PrivilegesOf(p).ids()
	if err != nil {
		return nil, err
	}
	tmp := path + ".new"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(p.Config)
	if err == nil && set {
		err = f.Chown(uid, gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	argv := make([]string, len(p.Command))
	for i, a := range p.Command {
		argv[i] = strings.ReplaceAll(a, spec.ConfigPlaceholder, path)
	}
	return argv, nil
}

// Load returns the record of one process, or nil if there is none; a
// launch cut short is recovered and recorded (see recoverLaunch).
func (s *Store) Load(ns, name string) (*Record, error) { return s.load(ns, name, true) }

func (s *Store) load(ns, name string, save bool) (*Record, error) {
	b, err := os.ReadFile(s.recordPath(ns, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("record %s: %w", s.recordPath(ns, name), err)
	}
	if r.Launching && !launchInProgress(&r) {
		return s.recoverLaunch(&r, save)
	}
	return &r, nil // a launch in progress stays as it is: Launching, no PID
}

// Save writes a record atomically.
func (s *Store) Save(r *Record) error {
	p := s.recordPath(r.Namespace, r.Name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Namespaces returns the namespaces that have records, read in one pass:
// a caller going through a whole fleet asks Records only about those
// (looking for each namespace's directory cost a failed path walk each).
func (s *Store) Namespaces() (map[string]bool, error) {
	ents, err := os.ReadDir(filepath.Join(s.Dir, "procs"))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ents))
	for _, e := range ents {
		if e.IsDir() {
			out[e.Name()] = true
		}
	}
	return out, nil
}

// Records returns the records of one namespace, sorted by process name. It
// only reads: a launch in progress shows as its process if it has
// started, else as not running, and its record is left to the launcher.
func (s *Store) Records(ns string) ([]*Record, error) {
	ents, err := os.ReadDir(filepath.Join(s.Dir, "procs", ns))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := s.load(ns, name, false) // a reader: see recoverLaunch
		if err != nil || r == nil {
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// procStart reads a process's start time and state from /proc/PID/stat.
func procStart(pid int) (start uint64, state byte, err error) {
	return StartTime(pid)
}

// StartTime reads a process's start time (clock ticks since boot, which
// tells it from a later process with the same PID) and its state letter
// from /proc/PID/stat.
func StartTime(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, errors.New("malformed stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0][0], err
}

// Alive reports whether the record's process is still the one nsfleet
// started: same PID, same start time, same network namespace, not a zombie.
func Alive(r *Record) bool {
	if r == nil || r.PID <= 0 {
		return false
	}
	start, state, err := procStart(r.PID)
	if err != nil || start != r.StartTime || state == 'Z' || state == 'X' {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(r.PID)+"/ns/net", &st); err != nil {
		return false
	}
	return st.Ino == r.NetNS
}

// Launch starts p inside ns (pinned as nsName), detached in a session of
// its own with stdin on /dev/null and stdout and stderr appended to its log
// file, and saves its record. The caller must either reap the returned
// command (cmd.Wait) or let go of it (cmd.Process.Release): until then Go
// holds a pidfd for it.
func (s *Store) Launch(ns *netns.NS, nsName string, p spec.Process, restarts int) (*Record, *exec.Cmd, error) {
	logPath := s.LogPath(nsName, p.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return nil, nil, fmt.Errorf("process %s: log: %w%s", p.Name, err, netns.FullOrReadOnly(s.Dir, err))
	}
	logf, err := pool.RetryValue(func() (*os.File, error) {
		return os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("process %s: log: %w%s", p.Name, err, netns.FullOrReadOnly(s.Dir, err))
	}
	defer logf.Close()
	argv, err := s.writeConfig(nsName, p)
	if err != nil {
		return nil, nil, fmt.Errorf("process %s: config: %w%s", p.Name, err, netns.FullOrReadOnly(s.Dir, err))
	}
	// A log that cannot be written is a start that failed: a daemon whose
	// output vanishes is worse than one that is reported not running.
	if _, err := fmt.Fprintf(logf, "--- nsfleet: starting %s in %s: %s\n", p.Name, nsName, strings.Join(argv, " ")); err != nil {
		return nil, nil, fmt.Errorf("process %s: log %s: %w%s", p.Name, logPath, err, netns.FullOrReadOnly(logPath, err))
	}
	// Recorded as launching first: if nsfleet dies between the start and
	// the record, the next Load finds the process by its marker.
	started := time.Now()
	fp := Fingerprint(p)
	self := os.Getpid()
	selfStart, _, _ := procStart(self)
	if err := s.Save(&Record{Namespace: nsName, Name: p.Name, Restarts: restarts, Started: started, Command: p.Command, Spec: fp,
		Launching: true, Launcher: self, LauncherStart: selfStart}); err != nil {
		return nil, nil, fmt.Errorf("process %s: record: %w%s", p.Name, err, netns.FullOrReadOnly(s.Dir, err))
	}
	env := append(os.Environ(), s.marker(nsName, p.Name))
	devnull, err := pool.RetryValue(func() (*os.File, error) { return os.Open(os.DevNull) })
	if err != nil {
		return nil, nil, err
	}
	defer devnull.Close()
	// A Cmd that failed to start cannot be started again: build it anew
	// for each try.
	cmd, err := pool.RetryValue(func() (*exec.Cmd, error) {
		cmd, err := Command(argv, Options{Stdin: devnull, Stdout: logf, Stderr: logf, Env: env, Privileges: PrivilegesOf(p)})
		if err != nil {
			return nil, err
		}
		// A session of its own: no controlling terminal, and the whole
		// group can be signalled at once (daemons fork).
		cmd.SysProcAttr.Setsid = true
		if p.Config != "" {
			// Beside its config: what it names relatively (a control
			// socket, whose path may have at most 107 bytes) goes there.
			cmd.Dir = filepath.Dir(s.ConfigPath(nsName, p.Name))
		}
		return cmd, Start(ns, cmd)
	})
	if err != nil {
		s.Save(&Record{Namespace: nsName, Name: p.Name, Restarts: restarts, Started: started, Command: p.Command, Spec: fp})
		return nil, nil, fmt.Errorf("process %s: %w", p.Name, err)
	}
	r := &Record{Namespace: nsName, Name: p.Name, PID: cmd.Process.Pid, NetNS: ns.Inode(), Restarts: restarts, Started: started, Command: p.Command, Spec: fp}
	if r.StartTime, _, err = procStart(r.PID); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, nil, fmt.Errorf("process %s: %w", p.Name, err)
	}
	if err := s.Save(r); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, nil, fmt.Errorf("process %s: record: %w%s", p.Name, err, netns.FullOrReadOnly(s.Dir, err))
	}
	return r, cmd, nil
}

// Fingerprint names a process's spec: two specs with the same fingerprint
// start the same process the same way.
func Fingerprint(p spec.Process) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%#v", p))
	return hex.EncodeToString(h[:8])
}

// Changed reports whether a running process was started from another spec
// than p. Records from before fingerprints compare their command only.
func Changed(r *Record, p spec.Process) bool {
	if r.Spec == "" {
		return !slices.Equal(r.Command, p.Command)
	}
	return r.Spec != Fingerprint(p)
}

// Remove stops a process that is no longer in the spec and forgets its
// record (its log stays).
func (s *Store) Remove(ns, name string, grace time.Duration) error {
	r, err := s.Load(ns, name)
	if err != nil || r == nil {
		return err
	}
	if err := s.Stop(r, grace); err != nil {
		return err
	}
	os.Remove(s.ConfigPath(ns, name))
	if err := os.Remove(s.recordPath(ns, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Stop ends a recorded process: the record is marked stopped first (so a
// supervisor does not restart it), then its process group gets SIGTERM,
// then SIGKILL after grace. It returns once the process is gone.
func (s *Store) Stop(r *Record, grace time.Duration) error {
	r.Stopped = true
	if err := s.Save(r); err != nil {
		return err
	}
	if !Alive(r) {
		return nil
	}
	// A pidfd pins the process: its exit is waited for without polling,
	// and a reused PID is never signalled. Without one (no descriptor
	// left, or a kernel before 5.3), /proc is polled.
	fd, err := pidfdOpen(r.PID)
	if err == nil {
		defer unix.Close(fd)
		if !Alive(r) { // the PID was reused just before the pidfd
			return nil
		}
	}
	// The process leads its own session and group (Setsid at launch).
	syscall.Kill(-r.PID, syscall.SIGTERM)
	if waitGone(r, fd, grace) {
		return nil
	}
	syscall.Kill(-r.PID, syscall.SIGKILL)
	if waitGone(r, fd, 5*time.Second) {
		return nil
	}
	return fmt.Errorf("process %s (pid %d) in %s survived SIGKILL", r.Name, r.PID, r.Namespace)
}

// waitGone waits up to timeout for the process to exit, on its pidfd if
// fd >= 0, else by polling /proc.
func waitGone(r *Record, fd int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !Alive(r) {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		if fd >= 0 {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			unix.Poll(pfd, int(min(left, time.Second)/time.Millisecond)+1)
			continue
		}
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// StopAll stops every recorded process of a namespace.
func (s *Store) StopAll(ns string, grace time.Duration) error {
	recs, err := s.Records(ns)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		errs = append(errs, s.Stop(r, grace))
	}
	return errors.Join(errs...)
}

// Forget removes the records and configs of a namespace that is gone (its
// logs stay).
func (s *Store) Forget(ns string) error {
	os.RemoveAll(filepath.Join(s.Dir, "configs", ns))
	return os.RemoveAll(filepath.Join(s.Dir, "procs", ns))
}
