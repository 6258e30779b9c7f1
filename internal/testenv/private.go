package testenv

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Private servers: a test that pauses, kills or restarts a server starts
// its own, on free loopback ports in [privatePortMin, privatePortMax] (below
// the kernel's ephemeral range, so an outgoing connection cannot take a
// port a stopped server will bind again), with its data in a temporary
// directory. It is stopped by PID when the test ends.
const (
	privatePortMin = 27000
	privatePortMax = 27999
)

// Server is one private server process. Its methods may be called from any
// goroutine; they report errors rather than failing the test, so that a
// fault schedule running beside the test can use them.
type Server struct {
	Kind string // "redis", "memcached", "postgres", "mariadb", "etcd", "zookeeper"
	Name string // unique in the test, e.g. "etcd-2"
	Addr string // client host:port
	// URL is the connection URL for postgres and mariadb ("" otherwise).
	URL string
	// Ports used besides Addr's (peer, election), kept across restarts.
	Ports []int

	dir     string
	command func() *exec.Cmd // a fresh command for each start
	ready   func(ctx context.Context, s *Server) error
	startIn time.Duration // readiness bound
	stopSig syscall.Signal

	mu     sync.Mutex
	proc   *os.Process
	done   chan struct{} // closed when proc has been waited for
	paused bool
	logf   *os.File
}

// PID is the server's process id, or 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid
}

// Pause stops the server with SIGSTOP (its whole process group: postgres
// backends too). Connections stay open; nothing is answered.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.signalLocked(syscall.SIGSTOP); err != nil {
		return err
	}
	s.paused = true
	return nil
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.signalLocked(syscall.SIGCONT); err != nil {
		return err
	}
	s.paused = false
	return nil
}

// Kill ends the server with SIGKILL and waits for it to exit, its
// descendants too: a postgres backend that outlives its postmaster keeps
// the shared memory attached, and the next start refuses to run.
func (s *Server) Kill() error {
	s.mu.Lock()
	kids := alive(s.descendantsLocked())
	err := s.signalLocked(syscall.SIGKILL)
	done := s.done
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.waitExit(done, kids, 10*time.Second)
}

// Restart kills the server, starts it again on the same ports and waits
// until it answers. Redis and memcached come back empty (no persistence);
// postgres, MariaDB, etcd and ZooKeeper keep their data directories.
func (s *Server) Restart() error {
	if s.PID() != 0 {
		if err := s.Kill(); err != nil {
			return err
		}
	}
	return s.Start()
}

// Start starts the server if it is not running and waits until it answers.
func (s *Server) Start() error {
	if err := s.spawn(); err != nil {
		return err
	}
	return s.WaitReady()
}

// WaitReady waits, bounded, until the server answers a real request.
func (s *Server) WaitReady() error { return s.waitReady(s.startIn) }

func (s *Server) waitReady(bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	var last error
	for {
		if done == nil {
			return fmt.Errorf("%s: not running", s.Name)
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited while starting; log:\n%s", s.Name, s.LogTail(20))
		default:
		}
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		last = s.ready(rctx, s)
		rcancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s on %s not ready after %v: %v; log:\n%s", s.Name, s.Addr, bound, last, s.LogTail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop ends the server (resumed first if paused) with its own shutdown
// signal, SIGKILL after 10 s, and waits for it. Stopping a stopped server
// does nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.proc == nil {
		s.mu.Unlock()
		return nil
	}
	if s.paused {
		_ = s.signalLocked(syscall.SIGCONT)
		s.paused = false
	}
	_ = syscall.Kill(s.proc.Pid, s.stopSig)
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
	}
	s.mu.Lock()
	kids := alive(s.descendantsLocked())
	_ = s.signalLocked(syscall.SIGKILL)
	s.mu.Unlock()
	return s.waitExit(done, kids, 10*time.Second)
}

// LogTail returns the last n lines of the server's output.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// signalLocked signals the server's process group.
func (s *Server) signalLocked(sig syscall.Signal) error {
	if s.proc == nil {
		return fmt.Errorf("%s: not running", s.Name)
	}
	select {
	case <-s.done:
		return fmt.Errorf("%s: exited", s.Name)
	default:
	}
	if err := syscall.Kill(-s.proc.Pid, sig); err != nil {
		return fmt.Errorf("%s: %v: %w", s.Name, sig, err)
	}
	// PostgreSQL's backends each call setsid(), leaving the group: reach
	// every descendant by its own PID too.
	for _, pid := range descendants(s.proc.Pid) {
		_ = syscall.Kill(pid, sig)
	}
	return nil
}

// descendants lists the PIDs of every process under pid, from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The parent is the second field after the parenthesised command,
		// which may itself contain spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil {
			children[ppid] = append(children[ppid], child)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 && len(out) < 10000 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}

// waitExit waits, up to d, for the server to exit and for every process of
// kids to be gone.
func (s *Server) waitExit(done chan struct{}, kids []proc, d time.Duration) error {
	deadline := time.After(d)
	select {
	case <-done:
	case <-deadline:
		return fmt.Errorf("%s: still running %v after SIGKILL", s.Name, d)
	}
	for len(kids) > 0 {
		if kids = alive(kids); len(kids) == 0 {
			break
		}
		select {
		case <-deadline:
			return fmt.Errorf("%s: process %d still running %v after SIGKILL", s.Name, kids[0].pid, d)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// descendantsLocked lists the server's descendants with their start times.
func (s *Server) descendantsLocked() []proc {
	if s.proc == nil {
		return nil
	}
	var out []proc
	for _, pid := range descendants(s.proc.Pid) {
		out = append(out, proc{pid, startTime(pid)})
	}
	return out
}

// proc is a process, told apart from a later one with its PID by its start
// time.
type proc struct {
	pid   int
	start string
}

// alive returns the processes of ps still running: not gone, not a zombie,
// and not replaced by another with the same PID.
func alive(ps []proc) []proc {
	var out []proc
	for _, p := range ps {
		if p.start != "" && startTime(p.pid) == p.start {
			out = append(out, p)
		}
	}
	return out
}

// startTime is the start time field of pid's /proc stat, "" when pid is
// gone or a zombie (which holds no memory or sockets any more).
func startTime(pid int) string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	// After the command: state, ppid, … starttime is the 20th.
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return ""
	}
	return fields[19]
}

// spawn starts the process in its own process group, output to server.log.
func (s *Server) spawn() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		select {
		case <-s.done:
		default:
			return nil // running
		}
	}
	if s.logf == nil {
		f, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		s.logf = f
	}
	cmd := s.command()
	cmd.Stdout, cmd.Stderr = s.logf, s.logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	// The server must die with the test binary even if Cleanup never runs.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	fmt.Fprintf(s.logf, "===== %s start: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(cmd.Args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	done := make(chan struct{})
	s.proc, s.done, s.paused = cmd.Process, done, false
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	return nil
}

// newServer starts one server for the test (see startGroup).
func newServer(t testing.TB, s *Server) *Server {
	t.Helper()
	return startGroup(t, []*Server{s})[0]
}

// needBinary fails (CI) or skips the test when a server binary is missing.
func needBinary(t testing.TB, path string) string {
	t.Helper()
	p, err := exec.LookPath(path)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("testenv: %s not found (scripts/services.sh up installs it): %v", path, err)
	if requireServers() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

var (
	portsMu sync.Mutex
	ports   = map[int]bool{} // handed out in this process
)

// FreePorts returns n distinct loopback ports in the private range that
// nothing listens on now and that this process has not handed out.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	var out []int
	span := privatePortMax - privatePortMin + 1
	start := rand.IntN(span)
	for i := 0; i < span && len(out) < n; i++ {
		p := privatePortMin + (start+i)%span
		if ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		ports[p] = true
		out = append(out, p)
	}
	if len(out) < n {
		t.Fatalf("testenv: only %d free ports in %d-%d", len(out), privatePortMin, privatePortMax)
	}
	return out
}

func loopback(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// exchange dials addr, writes req and reads until the answer contains want.
func exchange(ctx context.Context, addr, req, want string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(req)); err != nil {
		return err
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if strings.Contains(got.String(), want) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("answer %q, want %q: %w", got.String(), want, err)
		}
	}
}
