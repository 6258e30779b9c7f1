//go:build unix

package main

// The guardian: a copy of lockctl, started before COMMAND, that ends
// COMMAND's process group when lockctl dies while holding the lock, by any
// signal, SIGKILL included. It reads a pipe of which lockctl holds the only
// write end: the kernel closes it when lockctl dies, so EOF without "done"
// means lockctl is gone, on every Unix, whatever killed it. lockctl keeps
// it told how long the lock is known to live, so that the group is killed
// before the store can give the lock to another holder.
//
// Messages, one per line, lockctl to guardian:
//
//	name "NAME"    for the guardian's message (Go-quoted)
//	grace NS       --grace, in nanoseconds
//	until NS       COMMAND's group must be gone within NS from now
//	pgid N         COMMAND's process group
//	done           lockctl ends normally: exit without touching the group

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envGuardian, set to guardianMode, makes lockctl the guardian, and
// envGate the gate (see gate): hidden modes, not subcommands.
const (
	envGuardian  = "_LOCKCTL_GUARDIAN"
	envGate      = "_LOCKCTL_GATE"
	guardianMode = "1"
)

// selfExe is lockctl's binary.
func selfExe() (string, error) {
	exe := "/proc/self/exe" // Linux: lockctl's binary even if replaced since
	if _, err := os.Stat(exe); err == nil {
		return exe, nil
	}
	return os.Executable()
}

// guardMargin is how much sooner than the lock's deadline the guardian's
// SIGKILL goes out: for the pipe's latency, the guardian's timer firing
// late on a busy machine and the group's dying. The deadline itself is a
// clock margin before the store's (backend.ClockMargin).
func guardMargin(ttl time.Duration) time.Duration {
	return 100*time.Millisecond + ttl/50
}

// guardian is lockctl's end of the pipe to its guardian process.
type guardian struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	w      *os.File // nil once done
	margin time.Duration
	last   time.Time // the deadline last sent
	exited chan struct{}
}

// startGuardian starts the guardian of a run holding name. Its standard
// error is lockctl's, when that is a file; it holds no other descriptor of
// lockctl's, and its environment is empty but for the mode: no secret.
func startGuardian(name string, ttl, grace time.Duration, stderr io.Writer) (*guardian, error) {
	exe, err := selfExe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	c := &exec.Cmd{
		Path:       exe,
		Args:       []string{"lockctl-guardian"},
		Env:        []string{envGuardian + "=" + guardianMode},
		ExtraFiles: []*os.File{r},
		// A group of its own: what kills lockctl's group (a shell's job
		// control, timeout(1)) does not kill it.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if f, ok := stderr.(*os.File); ok {
		c.Stderr = f
	}
	if err := c.Start(); err != nil {
		w.Close()
		return nil, err
	}
	g := &guardian{cmd: c, w: w, margin: guardMargin(ttl), exited: make(chan struct{})}
	go func() {
		c.Wait()
		close(g.exited)
	}()
	g.send("name %s\ngrace %d\n", strconv.Quote(name), grace)
	return g, nil
}

// send writes one or more messages. A guardian that does not read (stopped)
// must not stop lockctl: past a second the message is dropped, which leaves
// the guardian an earlier deadline than the lock's, the safe side.
func (g *guardian) send(format string, args ...any) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		return
	}
	g.w.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(g.w, format, args...)
}

// until tells the guardian l's deadline, if it moved.
func (g *guardian) until(l held) {
	if g == nil {
		return
	}
	d := l.Deadline()
	if d.Equal(g.last) {
		return
	}
	g.last = d
	left := time.Until(d) - g.margin
	if d.IsZero() {
		left = 0
	}
	g.send("until %d\n", max(left, 0))
}

// group tells the guardian COMMAND's process group.
func (g *guardian) group(pgid int) { g.send("pgid %d\n", pgid) }

// gate makes c start as lockctl in gate mode, which execs COMMAND (same
// PID, group, files and environment) once open is called, and exits
// without running it if lockctl dies first: COMMAND never runs before the
// guardian knows its group. close releases what gate holds if c did not
// start.
func gate(c *exec.Cmd) (open, close func(), err error) {
	exe, err := selfExe()
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	env := c.Env
	if env == nil {
		env = os.Environ()
	}
	c.Env = append(env[:len(env):len(env)], envGate+"="+guardianMode)
	c.Args = append([]string{"lockctl-gate", c.Path}, c.Args...)
	c.Path = exe
	c.ExtraFiles = append(c.ExtraFiles, r)
	var once sync.Once
	close = func() { once.Do(func() { r.Close(); w.Close() }) }
	open = func() {
		once.Do(func() {
			r.Close()
			w.Write([]byte{'g'})
			w.Close()
		})
	}
	return open, close, nil
}

// gateMain is the gate process: it waits for lockctl's go-ahead, then
// becomes COMMAND.
func gateMain() int {
	f := os.NewFile(3, "lockctl")
	var b [1]byte
	if n, _ := f.Read(b[:]); n != 1 || b[0] != 'g' {
		return exitNoCommand // lockctl died before COMMAND could be guarded
	}
	f.Close()
	env := os.Environ()
	for i, kv := range env {
		if strings.HasPrefix(kv, envGate+"=") {
			env = append(env[:i], env[i+1:]...)
			break
		}
	}
	if len(os.Args) < 3 {
		return exitNoCommand
	}
	err := syscall.Exec(os.Args[1], os.Args[2:], env)
	fmt.Fprintf(os.Stderr, "lockctl: cannot run %s: %v\n", os.Args[2], err)
	return exitNoCommand
}

// stop ends the guardian, leaving COMMAND's group alone, and waits (a
// little) for it to exit.
func (g *guardian) stop() {
	if g == nil {
		return
	}
	g.send("done\n")
	g.mu.Lock()
	g.w.Close()
	g.w = nil
	g.mu.Unlock()
	select {
	case <-g.exited:
	case <-time.After(time.Second):
	}
}

// guardianMain is the guardian process: it returns when lockctl is done,
// or when lockctl died and COMMAND's group is gone or killed.
func guardianMain() int {
	// Signals are for lockctl, which passes them on; the guardian ends by
	// itself once lockctl does. Without a terminal's foreground, it must
	// not stop on writing there either; a closed stderr is not fatal.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE)
	parent := os.Getppid()
	in := bufio.NewScanner(os.NewFile(3, "lockctl"))
	in.Buffer(nil, 1<<20)
	var (
		name   string
		grace  time.Duration
		killBy time.Time // zero until lockctl says: the group goes at once
		pgid   int
	)
	for in.Scan() {
		key, val, _ := strings.Cut(in.Text(), " ")
		n, _ := strconv.ParseInt(val, 10, 64)
		switch key {
		case "name":
			name, _ = strconv.Unquote(val)
		case "grace":
			grace = time.Duration(n)
		case "until":
			killBy = time.Now().Add(time.Duration(n))
		case "pgid":
			pgid = int(n)
		case "done":
			return 0
		}
	}
	// EOF (or a read error): lockctl is gone without saying it is done.
	if pgid <= 0 {
		return 0
	}
	now := time.Now()
	killAt := now.Add(grace)
	if killBy.Before(killAt) {
		killAt = killBy
	}
	if !killAt.After(now) {
		syscall.Kill(-pgid, syscall.SIGKILL)
		fmt.Fprintf(os.Stderr, "lockctl: lockctl (pid %d) died holding %q: sent SIGKILL to COMMAND's process group (the lock may expire any moment)\n", parent, name)
		return 0
	}
	if err := syscall.Kill(-pgid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		return 0
	}
	fmt.Fprintf(os.Stderr, "lockctl: lockctl (pid %d) died holding %q: sent SIGTERM to COMMAND's process group (SIGKILL in %v, before the lock can expire)\n",
		parent, name, killAt.Sub(now).Round(time.Millisecond))
	for syscall.Kill(-pgid, 0) == nil {
		left := time.Until(killAt)
		if left <= 0 {
			syscall.Kill(-pgid, syscall.SIGKILL)
			break
		}
		time.Sleep(min(left, 10*time.Millisecond))
	}
	return 0
}
