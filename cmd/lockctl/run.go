//go:build unix

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// Environment of COMMAND.
const (
	envName      = "LOCKER_NAME"
	envFence     = "LOCKER_FENCE"
	envNames     = "LOCKER_NAMES"  // several names, one per line
	envFences    = "LOCKER_FENCES" // their fences, line by line
	envOwner     = "LOCKER_OWNER"
	envBackendID = "LOCKER_BACKEND_ID"
)

// held is what run holds: a Lock, or a LockSet for several names.
type held interface {
	Fence(name string) uint64
	TTL() time.Duration
	Deadline() time.Time
	Lost() <-chan struct{}
	Err() error
	Release(context.Context) error
}

// lockFence gives a Lock the LockSet's Fence(name).
type lockFence struct{ *locker.Lock }

func (l lockFence) Fence(string) uint64 { return l.Lock.Fence() }

type runOpts struct {
	backend  backendFlag
	store    string // the backend URL, redacted, for messages
	ttl      time.Duration
	wait     time.Duration
	waitSet  bool
	noWait   bool
	owner    string
	grace    time.Duration
	connect  time.Duration
	verbose  bool
	name     string   // the first of names
	names    []string // NAME...: one lock, or a set taken all or nothing
	quoted   string   // names, quoted, for messages
	command  []string
	stderr   io.Writer
	dashName bool // NAME came after "--"

	minHold     time.Duration
	lockDelay   time.Duration
	limit       int  // --limit: one of limit permits of the semaphore NAME
	weight      int  // --weight: that many of them at once (0: one)
	shared      bool // --shared: the read side of the read-write lock NAME
	exclusive   bool // --exclusive: its write side
	quietBusy   bool // another holder's lock is no error: exit 0, silent
	busyCode    int  // -E: the exit status when another holder has the lock
	busyCodeSet bool
	acquired    time.Time // just after the grant
	lingering   time.Time // until when Release left the lock held (--min-hold)
}

const runUsage = `usage: lockctl run [flags] NAME [NAME...] -- COMMAND [ARG...]

Acquires NAME (waiting, like flock(1), unless -n or -w say otherwise), runs
COMMAND with LOCKER_NAME and LOCKER_FENCE in its environment, and releases
the lock when COMMAND exits. Several names before -- are taken all or
nothing, in one order whatever order they are given in (no deadlock), and
COMMAND gets LOCKER_NAMES and LOCKER_FENCES instead, one per line, in that
order. Durations are seconds (5, 1.5) or have a unit
(300ms, 2m, 1h). -s and -x are the two sides of a read-write lock NAME,
which is not the lock that a run without them takes: every run of a name
says -s or -x, or none does.

Exit status:
  0      COMMAND ran and exited 0; with --quiet-busy also when another holder had
         the lock and COMMAND did not run
  N      COMMAND's own exit status
  128+N  COMMAND died of signal N, or lockctl was interrupted by it while waiting
  2      bad input or an error before COMMAND ran (backend unreachable, ...)
  75     not acquired: another holder has the lock (-n, or -w ran out; -E CODE
         changes it), or the store refused for a reason it gives
  76     the lock was lost while COMMAND ran
  127    COMMAND could not be started

`

// runFlags defines run's flags on o.
func runFlags(o *runOpts, global backendFlag) *flagSet {
	fs := newFlagSet("lockctl run")
	o.backend = global
	fs.Var(&o.backend, "backend", "the lock store's `URL` (default $LOCKER_URL, else this host only)")
	fs.duration(&o.ttl, "ttl", locker.DefaultTTL, "lock TTL: how long a crashed holder keeps others out\n(on ZooKeeper the session timeout, unless the URL sets session_timeout)")
	fs.duration(&o.wait, "wait", 0, "give up after waiting `D` (default: wait until acquired)")
	fs.alias("w", "wait")
	fs.BoolVar(&o.noWait, "no-wait", false, "give up at once if the lock is held")
	fs.alias("n", "no-wait")
	fs.IntVar(&o.busyCode, "conflict-exit-code", exitNotAcquired, "exit with `CODE` (0 to 255) when another holder has the lock (-n, -w)")
	fs.alias("E", "conflict-exit-code")
	fs.duration(&o.minHold, "min-hold", 0, "keep the lock held at least this long from its acquisition, however soon\nCOMMAND ends: a scheduled job started on several hosts runs once")
	fs.duration(&o.lockDelay, "lock-delay", 0, "if the lock is lost without a release (lockctl killed, cut off, paused past\nthe TTL), nobody gets NAME for this long after it expires")
	fs.IntVar(&o.limit, "limit", 0, "at most `N` COMMANDs at once: take one of N permits of the semaphore NAME\n(every run of NAME must say the same N; lockctl resize overrides it)")
	fs.IntVar(&o.weight, "weight", 0, "with --limit: take `K` of the N permits at once, all or none (default 1)")
	fs.BoolVar(&o.shared, "shared", false, "take the read side of the read-write lock NAME: shared with other\n-s runs, never with an -x one")
	fs.alias("s", "shared")
	fs.BoolVar(&o.exclusive, "exclusive", false, "take the write side of the read-write lock NAME: alone; waiting\n-x runs hold new -s ones back")
	fs.alias("x", "exclusive")
	fs.BoolVar(&o.quietBusy, "quiet-busy", false, "with -n or -w: exit 0, silently, when another holder has the lock\n(for cron mailers)")
	fs.StringVar(&o.owner, "owner", "", "the holder's `ID`; nested runs with the same NAME, owner and backend are reentrant")
	fs.duration(&o.grace, "grace", 10*time.Second, "after a lost lock, SIGKILL COMMAND's process group this long after SIGTERM")
	fs.duration(&o.connect, "connect-timeout", 10*time.Second, "bound on connecting to the backend")
	fs.BoolVar(&o.verbose, "verbose", false, "say on stderr where the lock is, and when it is acquired and released")
	fs.alias("v", "verbose")
	return fs
}

func runCmd(args []string, global backendFlag, stdout, stderr io.Writer) int {
	o := runOpts{stderr: stderr}
	fs := runFlags(&o, global)
	if code, ok := fs.parse(args, runUsage, stdout, stderr); !ok {
		return code
	}
	o.waitSet, o.busyCodeSet = fs.isSet("wait"), fs.isSet("conflict-exit-code")
	// After an explicit "--", NAME may start with '-'.
	n := len(args) - fs.NArg()
	o.dashName = n > 0 && args[n-1] == "--"
	if err := o.parseArgs(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "lockctl run: %v\n", err)
		return exitUsage
	}
	return o.run()
}

func (o *runOpts) parseArgs(rest []string) error {
	if err := locker.CheckTTL(o.ttl); err != nil {
		return fmt.Errorf("--ttl: %w", err)
	}
	switch {
	case o.noWait && o.waitSet:
		return errors.New("--wait and --no-wait exclude each other")
	case o.waitSet && o.wait <= 0:
		return fmt.Errorf("--wait %v: want a positive duration (or --no-wait)", o.wait)
	case o.grace < 0:
		return fmt.Errorf("--grace %v: want a non-negative duration", o.grace)
	case o.minHold < 0 || o.minHold > locker.MaxTTL:
		return fmt.Errorf("--min-hold %v: want 0 (none) to %v", o.minHold, locker.MaxTTL)
	case o.lockDelay < 0 || o.lockDelay > locker.MaxTTL-o.ttl:
		return fmt.Errorf("--lock-delay %v: want 0 (none) to %v with --ttl %v", o.lockDelay, locker.MaxTTL-o.ttl, o.ttl)
	case o.limit != 0 && locker.CheckLimit(o.limit) != nil:
		return fmt.Errorf("--limit %d: want 1 to %d", o.limit, locker.MaxLimit)
	case o.shared && o.exclusive || o.limit != 0 && (o.shared || o.exclusive):
		return errors.New("--limit, --shared and --exclusive exclude each other")
	case o.weight != 0 && o.limit == 0:
		return fmt.Errorf("--weight %d needs --limit N", o.weight)
	case o.weight < 0 || o.weight > o.limit:
		return fmt.Errorf("--weight %d: want 1 to --limit %d", o.weight, o.limit)
	case o.quietBusy && !o.noWait && !o.waitSet:
		return errors.New("--quiet-busy needs --no-wait or --wait D (without them, run waits until acquired)")
	case o.busyCodeSet && (o.busyCode < 0 || o.busyCode > 255):
		return fmt.Errorf("-E %d: want an exit status, 0 to 255", o.busyCode)
	case o.busyCodeSet && o.quietBusy:
		return errors.New("-E and --quiet-busy exclude each other (--quiet-busy exits 0)")
	case o.busyCodeSet && !o.noWait && !o.waitSet:
		return errors.New("-E needs -n or -w D (without them, run waits until acquired)")
	case o.connect <= 0:
		return fmt.Errorf("--connect-timeout %v: want a positive duration", o.connect)
	case len(rest) == 0:
		return errors.New("missing NAME (usage: lockctl run [flags] NAME [NAME...] -- COMMAND [ARG...])")
	}
	// The words before the first -- are names; without one, NAME COMMAND.
	if i := slices.Index(rest, "--"); i > 0 {
		o.names, o.command = rest[:i], rest[i+1:]
	} else {
		o.names, o.command = rest[:1], rest[1:]
		if len(o.command) > 0 && strings.HasPrefix(o.command[0], "-") {
			return fmt.Errorf("%q after NAME: flags go before NAME, and COMMAND after --", o.command[0])
		}
	}
	if len(o.command) == 0 {
		return errors.New("missing COMMAND (usage: lockctl run [flags] NAME [NAME...] -- COMMAND [ARG...])")
	}
	var q []string
	for _, n := range o.names {
		if err := locker.CheckName(n); err != nil {
			return fmt.Errorf("NAME: %w", err)
		}
		if strings.HasPrefix(n, "-") && !o.dashName {
			// Almost always a misplaced flag; "lockctl run [flags] -- -NAME -- COMMAND"
			// takes such a name.
			return fmt.Errorf("NAME %q starts with '-': flags go before NAME (or put -- before such a NAME)", n)
		}
		q = append(q, strconv.Quote(n))
	}
	if len(o.names) > 1 && o.owner != "" {
		return errors.New("--owner takes one NAME: nested runs re-enter one lock")
	}
	o.name, o.quoted = o.names[0], strings.Join(q, ", ")
	return nil
}

// signalError is the cause of a wait cut short by a signal to lockctl.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

func signalStatus(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 128 + 15
}

// interruptible runs f with a context that ends when a signal arrives on
// sigs, and returns the signal that cut it short, if any.
func interruptible[T any](ctx context.Context, sigs <-chan os.Signal, f func(context.Context) (T, error)) (T, os.Signal, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, nil, r.err
	case sig := <-sigs:
		cancel(signalError{sig})
		r := <-done
		return r.v, sig, r.err
	}
}

// logf writes one line on stderr: errors from client libraries may span
// several (pgx lists every host it tried).
func (o *runOpts) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	fmt.Fprintf(o.stderr, "lockctl: %s\n", strings.Join(lines, " "))
}

func (o *runOpts) run() int {
	// The backend is identified by the URL as written, ${NAME} references
	// and all: a nested run finds its enclosing run's hold without the
	// secrets, which COMMAND's environment no longer has.
	rawURL, err := resolveURL(o.backend, o.stderr)
	if err != nil {
		o.logf("%v", err)
		return exitUsage
	}
	bid := backendID(rawURL)

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	// Nested inside a run that holds NAME for the same owner: reentrant.
	if o.owner != "" && os.Getenv(envOwner) == o.owner && os.Getenv(envName) == o.name && os.Getenv(envBackendID) == bid {
		if o.verbose {
			o.logf("%q is held by an enclosing lockctl run for owner %q: running COMMAND under it", o.name, o.owner)
		}
		// COMMAND stays in this process group, the enclosing run's
		// COMMAND's: what that run sends its group reaches it directly.
		cmd := o.command
		c := exec.Command(cmd[0], cmd[1:]...)
		c.Env = os.Environ()
		c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			o.logf("cannot run %s: %v", cmd[0], err)
			return exitNoCommand
		}
		status, _ := o.supervise(c, nil, nil, sigs)
		return status
	}

	rawURL, secrets, err := expandURL(rawURL)
	if err != nil {
		o.logf("%v", err)
		return exitUsage
	}
	o.store = backend.RedactedString(rawURL)
	logger := warnLogger(o.stderr)
	client, sig, err := interruptible(context.Background(), sigs, func(ctx context.Context) (*locker.Client, error) {
		// Drivers report the context's cause: the bound is named once.
		cause := fmt.Errorf("no answer within --connect-timeout %v", o.connect)
		ctx, cancel := context.WithTimeoutCause(ctx, o.connect, cause)
		defer cancel()
		// The default TTL sizes a ZooKeeper session: --ttl on every backend.
		c, err := locker.Open(ctx, rawURL, locker.WithLogger(logger), locker.WithDefaultTTL(o.ttl))
		if err != nil && ctx.Err() != nil && !strings.Contains(err.Error(), cause.Error()) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return c, err
	})
	if sig != nil {
		if client != nil {
			client.Close()
		}
		o.logf("interrupted by %v while connecting", sig)
		return signalStatus(sig)
	}
	if err != nil {
		o.logf("%v", err)
		return exitUsage
	}
	defer func() {
		o.stay(client, sigs)
		client.Close()
	}()

	opts := []locker.LockOption{locker.TTL(o.ttl), locker.MinHold(o.minHold), locker.LockDelay(o.lockDelay)}
	switch {
	case o.limit > 0:
		opts = append(opts, locker.Semaphore(o.limit))
		if o.weight > 0 {
			opts = append(opts, locker.Permits(o.weight))
		}
	case o.shared:
		opts = append(opts, locker.Read())
	case o.exclusive:
		opts = append(opts, locker.Write())
	}
	if o.owner != "" {
		opts = append(opts, locker.Label(o.owner), locker.Reentrant(o.owner))
	}
	l, sig, err := interruptible(context.Background(), sigs, func(ctx context.Context) (held, error) {
		if o.waitSet {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, o.wait)
			defer cancel()
		}
		var l held
		var err error
		switch {
		case len(o.names) > 1 && o.noWait:
			l, err = client.TryAcquireAll(ctx, o.names, opts...)
		case len(o.names) > 1:
			l, err = client.AcquireAll(ctx, o.names, opts...)
		case o.noWait:
			var one *locker.Lock
			if one, err = client.TryAcquire(ctx, o.name, opts...); err == nil {
				l = lockFence{one}
			}
		default:
			var one *locker.Lock
			if one, err = client.Acquire(ctx, o.name, opts...); err == nil {
				l = lockFence{one}
			}
		}
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return l, nil
	})
	if sig != nil {
		if l != nil {
			o.release(l)
		}
		o.logf("interrupted by %v while waiting for %s", sig, o.quoted)
		return signalStatus(sig)
	}
	if err != nil {
		// Not acquired because another holder has the lock; a driver with
		// another reason (a restarted server) says so.
		var why *backend.NotAcquiredError
		busy := errors.Is(err, locker.ErrNotAcquired) && !errors.As(err, &why) &&
			(o.noWait || errors.Is(err, context.DeadlineExceeded))
		switch {
		case busy && o.quietBusy:
			return 0
		case busy && len(o.names) > 1:
			o.logf("not all of %s could be taken on %s: %v", o.quoted, o.store, err)
			return o.busyCode
		case busy:
			o.logf("%s", o.busy(client))
			return o.busyCode
		case why != nil:
			o.logf("%v", err)
			return exitNotAcquired
		default:
			o.logf("%v", err)
			return exitUsage
		}
	}
	o.acquired = time.Now()
	names, fences := o.names[0], strconv.FormatUint(l.Fence(o.name), 10)
	if len(o.names) > 1 {
		set := l.(*locker.LockSet)
		var fs []string
		for _, n := range set.Names() {
			fs = append(fs, strconv.FormatUint(set.Fence(n), 10))
		}
		names, fences = strings.Join(set.Names(), "\n"), strings.Join(fs, "\n")
	}
	if o.verbose {
		o.logf("acquired %s on %s (fence %s, ttl %v)", o.quoted, o.store, strings.ReplaceAll(fences, "\n", ", "), l.TTL())
	}

	cmd := o.command
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Env = without(os.Environ(), secrets)
	if len(o.names) > 1 {
		c.Env = append(c.Env, envNames+"="+names, envFences+"="+fences)
	} else {
		c.Env = append(c.Env, envName+"="+names, envFence+"="+fences)
	}
	if o.owner != "" {
		c.Env = append(c.Env, envOwner+"="+o.owner, envBackendID+"="+bid)
	}
	// The guardian runs before COMMAND starts, so that no moment of
	// COMMAND's life is unguarded.
	g, err := startGuardian(o.name, l.TTL(), o.grace, o.stderr)
	if err != nil {
		o.logf("cannot start the guardian: %v; if lockctl is killed, COMMAND will outlive the lock", err)
	}
	g.until(l)
	openGate, closeGate := func() {}, func() {}
	if g != nil && c.Err == nil {
		if openGate, closeGate, err = gate(c); err != nil {
			o.logf("cannot start the gate: %v; if lockctl is killed, COMMAND will outlive the lock", err)
			openGate, closeGate = func() {}, func() {}
		}
	}
	if err := o.start(c); err != nil {
		closeGate()
		g.stop()
		o.release(l)
		o.logf("cannot run %s: %v", cmd[0], err)
		return exitNoCommand
	}
	g.group(c.Process.Pid)
	openGate()
	status, lost := o.supervise(c, l, g, sigs)
	g.stop()
	if lost != nil {
		o.release(l)
		return exitLost
	}
	o.release(l)
	return status
}

// busy says that another holder has the lock: which one, where the store
// records it, and in which store, so that a run pointed at the wrong one
// shows it.
func (o *runOpts) busy(c *locker.Client) string {
	why := "(--no-wait)"
	if !o.noWait {
		why = fmt.Sprintf("(not acquired within --wait %v)", o.wait)
	}
	limit, resized := o.limit, ""
	if o.limit > 0 {
		if st, err := o.inspect(c, locker.Semaphore(0)); err == nil && st.Known.Has(locker.KnowsLimit) && st.Limit > 0 && st.Limit != o.limit {
			limit, resized = st.Limit, " (lockctl resize set it)"
		}
	}
	if o.weight > 1 {
		return fmt.Sprintf("fewer than %d of the %d permits%s of %s on %s are free %s", o.weight, limit, resized, o.quoted, o.store, why)
	}
	if o.limit > 0 {
		return fmt.Sprintf("all %d permits%s of %s on %s are held %s", limit, resized, o.quoted, o.store, why)
	}
	if h := o.heldBy(c); h != "" {
		return fmt.Sprintf("%s is held by another holder on %s: %s %s", o.quoted, o.store, h, why)
	}
	return fmt.Sprintf("%s is held by another holder on %s %s", o.quoted, o.store, why)
}

// heldBy describes the holder of o.name (owner, fence) where the store
// records it, or returns "": the message is best effort and waits for
// nothing but one bounded Inspect.
func (o *runOpts) heldBy(c *locker.Client) string {
	if o.limit > 0 || o.shared || o.exclusive {
		return "" // one holder to name: a lock's
	}
	s, err := o.inspect(c)
	if err != nil || !s.Held {
		return ""
	}
	return holder(s)
}

// inspect is one bounded Inspect of o.name, for a message.
func (o *runOpts) inspect(c *locker.Client, opts ...locker.LockOption) (locker.State, error) {
	ctx, cancel := context.WithTimeout(context.Background(), min(o.connect, 5*time.Second))
	defer cancel()
	return c.Inspect(ctx, o.name, opts...)
}

// start starts c in a process group of its own, with lockctl's standard
// files.
func (o *runOpts) start(c *exec.Cmd) error {
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	tty, fg := foregroundTTY()
	if fg {
		c.SysProcAttr.Foreground = true
		c.SysProcAttr.Ctty = tty
	}
	err := c.Start()
	if fg && err != nil {
		restoreTTY(tty)
	}
	return err
}

// supervise waits for c, passing signals on to its process group and
// stopping it if l is lost, and keeps g told of l's deadline. It returns
// the exit status as a shell reports it and the loss, if the lock was lost
// while c ran.
func (o *runOpts) supervise(c *exec.Cmd, l held, g *guardian, sigs <-chan os.Signal) (int, error) {
	// Signal COMMAND's process group, or only COMMAND when it shares
	// lockctl's group.
	target := -c.Process.Pid
	if c.SysProcAttr == nil || !c.SysProcAttr.Setpgid {
		target = c.Process.Pid
	}
	done := make(chan struct{})
	go func() {
		c.Wait()
		close(done)
	}()
	var lostC, guardGone <-chan struct{}
	var tick <-chan time.Time
	if l != nil {
		lostC = l.Lost()
	}
	if g != nil {
		guardGone = g.exited
		// Refreshes come every TTL/3 (session contacts every third of the
		// session timeout, which may be shorter): frequent looks keep the
		// guardian's deadline close behind the lock's.
		t := time.NewTicker(min(max(l.TTL()/12, 10*time.Millisecond), 250*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	var lost error
	var kill <-chan time.Time
	var killAt time.Time
wait:
	for {
		select {
		case sig := <-sigs:
			if s, ok := sig.(syscall.Signal); ok {
				syscall.Kill(target, s)
			}
		case <-lostC:
			lostC = nil
			lost = l.Err()
			o.logf("lost the lock on %s while COMMAND ran: %v; sending SIGTERM to COMMAND (SIGKILL in %v)", o.quoted, lost, o.grace)
			syscall.Kill(target, syscall.SIGTERM)
			killAt = time.Now().Add(o.grace)
			kill = time.After(o.grace)
		case <-kill:
			kill = nil
			syscall.Kill(target, syscall.SIGKILL)
		case <-tick:
			g.until(l)
		case <-guardGone:
			guardGone = nil
			o.logf("the guardian (pid %d) ended (%v): if lockctl is killed now, COMMAND will outlive the lock", g.cmd.Process.Pid, g.cmd.ProcessState)
		case <-done:
			break wait
		}
	}
	if tty, fg := foregroundTTY(); c.SysProcAttr != nil && c.SysProcAttr.Foreground && !fg {
		restoreTTY(tty)
	}
	if lost == nil && l != nil {
		if err := l.Err(); err != nil && errors.Is(err, locker.ErrLost) {
			lost = err
			o.logf("lost the lock on %s while COMMAND ran: %v", o.quoted, lost)
		}
	}
	if lost != nil {
		// COMMAND has exited; whatever else of its group remains gets the
		// rest of the grace period, then SIGKILL.
		if killAt.IsZero() {
			killAt = time.Now()
		}
		for syscall.Kill(target, 0) == nil {
			if time.Now().After(killAt) {
				syscall.Kill(target, syscall.SIGKILL)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return exitStatus(c.ProcessState), lost
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// release releases l, bounded in time: past its TTL the store frees it
// anyway.
func (o *runOpts) release(l held) {
	ctx, cancel := context.WithTimeout(context.Background(), min(max(l.TTL(), time.Second), 10*time.Second))
	defer cancel()
	until := o.acquired.Add(o.minHold)
	err := l.Release(ctx)
	switch {
	case err == nil && o.minHold > 0 && time.Now().Before(until):
		o.lingering = until
		if o.verbose {
			o.logf("released %s: left held until %s, min-hold %v", o.quoted, until.Format("15:04:05.000"), o.minHold)
		}
	case err == nil:
		if o.verbose {
			o.logf("released %s", o.quoted)
		}
	case l.Err() != nil:
		// Lost: reported already.
	default:
		o.logf("%v", err)
	}
}

// stay keeps lockctl, and with it a ZooKeeper session, alive until the
// lock's minimum hold has passed: a session-backed lock that the driver
// cannot move to a lifetime of its own (backend.Lingerer) is freed when
// the session ends, at Close. A signal ends the stay early.
func (o *runOpts) stay(c *locker.Client, sigs <-chan os.Signal) {
	d := c.Driver()
	_, session := backend.As[backend.Session](d)
	_, lingerer := backend.As[backend.Lingerer](d)
	rest := time.Until(o.lingering)
	if !session || lingerer || rest <= 0 {
		return
	}
	if o.verbose {
		o.logf("staying until %s: the lock lives as long as this process's session", o.lingering.Format("15:04:05.000"))
	}
	t := time.NewTimer(rest)
	defer t.Stop()
	select {
	case <-t.C:
	case sig := <-sigs:
		o.logf("interrupted by %v: %s is freed now, before its min-hold", sig, o.quoted)
	}
}

// without drops from env the variables lockctl sets for COMMAND, so that an
// outer run's values do not leak into an inner one's, and the variables
// named in secrets: those substituted into the backend URL.
func without(env, secrets []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == envName || k == envFence || k == envOwner || k == envBackendID || slices.Contains(secrets, k) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// backendID identifies a backend URL without revealing it, for nested runs.
func backendID(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		raw = backend.Redacted(u)
	}
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:8])
}

// warnLogger logs the Client's and the driver's warnings (weak transport,
// refreshes failing) on w, without timestamps.
func warnLogger(w io.Writer) *slog.Logger {
	return slog.New(skipLost{slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	})})
}

// skipLost drops the locker package's own "lock lost" warning: lockctl
// reports the loss itself, with what it does about it. Other warnings
// (refreshes failing and retried) go through.
type skipLost struct{ slog.Handler }

func (h skipLost) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "locker: lock lost" {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h skipLost) WithAttrs(as []slog.Attr) slog.Handler { return skipLost{h.Handler.WithAttrs(as)} }
func (h skipLost) WithGroup(g string) slog.Handler       { return skipLost{h.Handler.WithGroup(g)} }
