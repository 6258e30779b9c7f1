//go:build unix

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
)

// exitFree is the status of status on a free lock, and of release --force
// when it removed nothing.
const exitFree = 1

// probeOwner is the owner of release --force's probe of the next fence.
const probeOwner = "lockctl-release-probe"

// probeTTL bounds how long the probe could keep the lock if lockctl died
// between its TryAcquire and its Release.
const probeTTL = 2 * time.Second

// releaseHook, when set (by tests), runs at each stage of release --force:
// "inspected" (before the removal) and "removed" (before the probe).
var releaseHook func(stage string)

func hook(stage string) {
	if releaseHook != nil {
		releaseHook(stage)
	}
}

// opsFlags are the flags that status, list and release share.
type opsFlags struct {
	fs        *flagSet
	backend   backendFlag
	timeout   time.Duration
	json      bool
	semaphore bool
	rw        bool
}

// newOpsFlags returns the flags of cmd; withObjects adds --semaphore
// and --rw.
func newOpsFlags(cmd string, global backendFlag, withJSON, withObjects bool) *opsFlags {
	o := &opsFlags{fs: newFlagSet("lockctl " + cmd), backend: global}
	o.fs.Var(&o.backend, "backend", "the lock store's `URL` (default $LOCKER_URL, else this host only)")
	o.fs.duration(&o.timeout, "timeout", 10*time.Second, "bound on connecting to the backend and on each call to it")
	if withObjects {
		o.fs.BoolVar(&o.semaphore, "semaphore", false, "the semaphore NAME (lockctl run --limit), not the lock: each permit's holder")
		o.fs.BoolVar(&o.rw, "rw", false, "the read-write lock NAME (lockctl run -s, -x), not the lock: each reader and the writer")
	}
	if withJSON {
		o.fs.BoolVar(&o.json, "json", false, "print JSON (fields listed above)")
	}
	return o
}

// parse parses args, flags and operands in any order (an operand after
// "--" may start with '-'), and returns the operands. It reports -h and
// bad input itself, and then returns false and the exit status.
func (o *opsFlags) parse(args []string, stdout, stderr io.Writer, help string) ([]string, int, bool) {
	var operands []string
	for {
		if code, ok := o.fs.parse(args, help, stdout, stderr); !ok {
			return nil, code, false
		}
		rest := o.fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			operands = append(operands, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
	if o.timeout <= 0 {
		errorf(stderr, strings.TrimPrefix(o.fs.cmd, "lockctl "), "--timeout %v: want a positive duration", o.timeout)
		return nil, exitUsage, false
	}
	if o.semaphore && o.rw {
		errorf(stderr, strings.TrimPrefix(o.fs.cmd, "lockctl "), "--semaphore and --rw: a name's semaphore and read-write lock are separate; pick one")
		return nil, exitUsage, false
	}
	return operands, 0, true
}

// object returns the option that selects o's object, and its noun.
func (o *opsFlags) object() ([]locker.LockOption, string) {
	switch {
	case o.semaphore:
		return []locker.LockOption{locker.Semaphore(0)}, "semaphore"
	case o.rw:
		return []locker.LockOption{locker.Read()}, "read-write lock"
	}
	return nil, "lock"
}

// ops is one operator command's connection to the backend.
type ops struct {
	cmd     string // "status", for messages
	scheme  string // the backend's URL scheme, for messages
	store   string // the backend URL, redacted, for messages
	client  *locker.Client
	timeout time.Duration
	stdout  io.Writer
	stderr  io.Writer
	obj     []locker.LockOption // selects the semaphore or read-write lock
	noun    string              // "lock", "semaphore" or "read-write lock"
}

// open connects to the backend of o's flags. It reports its error itself
// and then returns nil.
func (o *opsFlags) open(cmd string, stdout, stderr io.Writer) *ops {
	rawURL, err := resolveURL(o.backend, stderr)
	if err == nil {
		rawURL, _, err = expandURL(rawURL)
	}
	if err != nil {
		errorf(stderr, cmd, "%v", err)
		return nil
	}
	scheme := ""
	if u, err := url.Parse(rawURL); err == nil {
		scheme = u.Scheme
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	c, err := locker.Open(ctx, rawURL, locker.WithLogger(warnLogger(stderr)))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (no answer within --timeout %v)", err, o.timeout)
		}
		errorf(stderr, cmd, "%v", err)
		return nil
	}
	obj, noun := o.object()
	return &ops{cmd: cmd, scheme: scheme, store: backend.RedactedString(rawURL), client: c, timeout: o.timeout, stdout: stdout, stderr: stderr, obj: obj, noun: noun}
}

func (p *ops) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.timeout)
}

// fail reports err in one line and returns exitUsage. what says, for
// ErrUnsupported, what the backend cannot do.
func (p *ops) fail(err error, what string) int {
	if errors.Is(err, locker.ErrUnsupported) {
		errorf(p.stderr, p.cmd, "the %s backend %s", p.scheme, what)
	} else {
		errorf(p.stderr, p.cmd, "%v", err)
	}
	return exitUsage
}

// errorf writes "lockctl CMD: message" in one line: errors from client
// libraries may span several.
func errorf(w io.Writer, cmd, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	lines := strings.Split(msg, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	fmt.Fprintf(w, "lockctl %s: %s\n", cmd, strings.Join(lines, " "))
}

// show prints s as is when that is unambiguous, else quoted.
func show(s string) string {
	if q := strconv.Quote(s); s == "" || q[1:len(q)-1] != s || strings.ContainsAny(s, " \t") {
		return q
	}
	return s
}

func showOwner(s locker.State) string {
	switch {
	case !s.Known.Has(locker.KnowsOwner):
		return "unknown"
	case s.Owner == "":
		return "(none given)"
	default:
		return show(s.Owner)
	}
}

func showFence(s locker.State) string {
	if !s.Known.Has(locker.KnowsFence) {
		return "unknown"
	}
	return strconv.FormatUint(s.Fence, 10)
}

func showTTL(s locker.State) string {
	if !s.Known.Has(locker.KnowsTTL) {
		return "unknown"
	}
	return s.TTL.Round(time.Millisecond).String()
}

// holder describes a holder in a sentence: owner "x", fence 7.
func holder(s locker.State) string {
	var parts []string
	if s.Known.Has(locker.KnowsOwner) {
		if s.Owner == "" {
			parts = append(parts, "no owner given")
		} else {
			parts = append(parts, fmt.Sprintf("owner %q", s.Owner))
		}
	}
	if s.Known.Has(locker.KnowsFence) {
		parts = append(parts, fmt.Sprintf("fence %d", s.Fence))
	}
	return strings.Join(parts, ", ")
}

// jsonState is the JSON form of a State: name and held always, every
// other field only when the store reported it (and, for owner, fence and
// ttl_ms, only when the lock is held).
type jsonState struct {
	Name    string       `json:"name"`
	Held    bool         `json:"held"`
	Owner   *string      `json:"owner,omitempty"`
	Fence   *uint64      `json:"fence,omitempty"`
	TTLMs   *int64       `json:"ttl_ms,omitempty"`
	Waiters *int         `json:"waiters,omitempty"`
	Queue   []string     `json:"queue,omitempty"`
	Limit   *int         `json:"limit,omitempty"`
	Holders []jsonHolder `json:"holders,omitempty"`
}

// jsonHolder is the JSON form of a semaphore's or read-write lock's
// holder: fence and permits always, the rest as for a lock.
type jsonHolder struct {
	Owner   *string `json:"owner,omitempty"`
	Fence   uint64  `json:"fence"`
	TTLMs   *int64  `json:"ttl_ms,omitempty"`
	Permits int     `json:"permits"`
	Write   bool    `json:"write,omitempty"`
}

func toJSON(s locker.State) jsonState {
	j := jsonState{Name: s.Name, Held: s.Held}
	// A lock's holder; a semaphore's or read-write lock's are in holders.
	lock := s.Held && !s.Known.Has(locker.KnowsHolders)
	if lock && s.Known.Has(locker.KnowsOwner) {
		j.Owner = &s.Owner
	}
	if lock && s.Known.Has(locker.KnowsFence) {
		j.Fence = &s.Fence
	}
	if lock && s.Known.Has(locker.KnowsTTL) {
		ms := s.TTL.Milliseconds()
		j.TTLMs = &ms
	}
	if s.Known.Has(locker.KnowsWaiters) {
		j.Waiters = &s.Waiters
	}
	if s.Known.Has(locker.KnowsQueue) {
		j.Queue = s.Queue
		if j.Queue == nil {
			j.Queue = []string{}
		}
	}
	if s.Known.Has(locker.KnowsLimit) && s.Limit > 0 { // a free one's limit set by resize
		j.Limit = &s.Limit
	}
	for _, h := range s.Holders {
		jh := jsonHolder{Fence: h.Fence, Permits: h.Weight, Write: h.Write}
		if s.Known.Has(locker.KnowsOwner) {
			jh.Owner = &h.Owner
		}
		if s.Known.Has(locker.KnowsTTL) {
			ms := h.TTL.Milliseconds()
			jh.TTLMs = &ms
		}
		j.Holders = append(j.Holders, jh)
	}
	return j
}

func writeJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", b)
}

const jsonFields = `JSON fields: name, held; and, only when the store reports them: owner,
fence, ttl_ms (time left, in milliseconds), waiters (count), queue (the
waiters' owners, next first). owner, fence and ttl_ms are for held locks.
With --semaphore or --rw: limit (a semaphore's), and holders, each with
fence, permits (1 for a reader or writer), write (the writer), and owner
and ttl_ms when the store reports them.
`

const statusHelp = `usage: lockctl status [--json] [--semaphore | --rw] [--backend URL] [--timeout D] NAME

Prints what the store knows of the lock NAME: held or free and, where the
store records them, its holder's owner, fence and time left, and the
waiters queued behind it; then the store it asked (store:, not in JSON).
A field the store does not record shows as "unknown" (omitted from JSON).
With --semaphore (--rw), of the semaphore (read-write lock) NAME instead:
its limit and each holder's fence, owner, permits (or side) and time left.

Exit status: 0 held, 1 free, 2 error.

` + jsonFields + `
`

func statusCmd(args []string, globalBackend backendFlag, stdout, stderr io.Writer) int {
	const cmd = "status"
	f := newOpsFlags(cmd, globalBackend, true, true)
	operands, code, ok := f.parse(args, stdout, stderr, statusHelp)
	if !ok {
		return code
	}
	name, err := oneName(operands, "lockctl status [flags] NAME")
	if err != nil {
		errorf(stderr, cmd, "%v", err)
		return exitUsage
	}
	p := f.open(cmd, stdout, stderr)
	if p == nil {
		return exitUsage
	}
	defer p.client.Close()
	ctx, cancel := p.ctx()
	defer cancel()
	s, err := p.client.Inspect(ctx, name, p.obj...)
	if err != nil {
		return p.fail(err, "cannot read a "+p.noun+"'s state")
	}
	switch {
	case f.json:
		writeJSON(stdout, toJSON(s))
	case p.obj != nil:
		printHolders(stdout, s, p.noun, p.store)
	default:
		printStatus(stdout, s, p.store)
	}
	if !s.Held {
		return exitFree
	}
	return 0
}

func printStatus(w io.Writer, s locker.State, store string) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	if s.Held {
		fmt.Fprintf(tw, "%s: held\n", show(s.Name))
		fmt.Fprintf(tw, "  owner:\t%s\n", showOwner(s))
		fmt.Fprintf(tw, "  fence:\t%s\n", showFence(s))
		fmt.Fprintf(tw, "  time left:\t%s\n", showTTL(s))
	} else {
		fmt.Fprintf(tw, "%s: free\n", show(s.Name))
	}
	if s.Known.Has(locker.KnowsWaiters) {
		fmt.Fprintf(tw, "  waiters:\t%d\n", s.Waiters)
	} else if s.Held {
		fmt.Fprintf(tw, "  waiters:\tunknown\n")
	}
	if s.Known.Has(locker.KnowsQueue) && len(s.Queue) > 0 {
		q := make([]string, len(s.Queue))
		for i, o := range s.Queue {
			q[i] = show(o)
		}
		fmt.Fprintf(tw, "  queue:\t%s\n", strings.Join(q, ", "))
	}
	fmt.Fprintf(tw, "  store:\t%s\n", store)
	tw.Flush()
}

// printHolders prints the state of a semaphore or read-write lock: one
// line per holder, lowest fence first.
func printHolders(w io.Writer, s locker.State, noun, store string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	switch {
	case !s.Held && s.Known.Has(locker.KnowsLimit) && s.Limit > 0:
		fmt.Fprintf(tw, "%s: %s, free, limit %d\n", show(s.Name), noun, s.Limit)
	case !s.Held:
		fmt.Fprintf(tw, "%s: %s, free\n", show(s.Name), noun)
	default:
		fmt.Fprintf(tw, "%s: %s, %s\n", show(s.Name), noun, holdersSummary(s, noun))
		fmt.Fprintln(tw, "  FENCE\tOWNER\tHOLDS\tTIME LEFT")
		for _, h := range s.Holders {
			fmt.Fprintf(tw, "  %s\n", holderRow(s, h, noun))
		}
	}
	if s.Known.Has(locker.KnowsWaiters) {
		fmt.Fprintf(tw, "  waiters: %d\n", s.Waiters)
	}
	fmt.Fprintf(tw, "  store: %s\n", store)
	tw.Flush()
}

// holderRow is one holder's columns: fence, owner, what it holds, time
// left.
func holderRow(s locker.State, h locker.Holder, noun string) string {
	hs := locker.State{Owner: h.Owner, TTL: h.TTL, Known: s.Known}
	return fmt.Sprintf("%d\t%s\t%s\t%s", h.Fence, showOwner(hs), holds(h, noun), showTTL(hs))
}

// holdersSummary says how much of s is taken: "3 of 5 permits held",
// "2 readers", "its writer".
func holdersSummary(s locker.State, noun string) string {
	switch {
	case noun != "semaphore" && s.Holders[0].Write:
		return "held by its writer"
	case noun != "semaphore" && len(s.Holders) == 1:
		return "1 reader"
	case noun != "semaphore":
		return fmt.Sprintf("%d readers", len(s.Holders))
	}
	n := 0
	for _, h := range s.Holders {
		n += h.Weight
	}
	if !s.Known.Has(locker.KnowsLimit) {
		return fmt.Sprintf("%d permits held", n)
	}
	return fmt.Sprintf("%d of %d permits held", n, s.Limit)
}

// holds says what one holder has: "2 permits", "read", "write".
func holds(h locker.Holder, noun string) string {
	switch {
	case h.Write:
		return "write"
	case noun != "semaphore":
		return "read"
	case h.Weight == 1:
		return "1 permit"
	}
	return fmt.Sprintf("%d permits", h.Weight)
}

// oneName checks that operands is one lock name.
func oneName(operands []string, usage string) (string, error) {
	switch {
	case len(operands) == 0:
		return "", fmt.Errorf("missing NAME (usage: %s)", usage)
	case len(operands) > 1:
		return "", fmt.Errorf("%q after NAME: one NAME only (usage: %s)", operands[1], usage)
	}
	if err := locker.CheckName(operands[0]); err != nil {
		return "", fmt.Errorf("NAME: %w", err)
	}
	return operands[0], nil
}

const listHelp = `usage: lockctl list [--json] [--semaphore | --rw] [--backend URL] [--timeout D] [PREFIX]

Lists the held locks whose names start with PREFIX (all without one),
sorted by name: name, owner, fence and time left ("unknown" where the store
does not record it). With --semaphore (--rw), the held semaphores
(read-write locks) instead, one line per holder, with what it holds.
--json prints one array of objects.
Backends whose store cannot enumerate its keys (memcached) refuse.

Exit status: 0 listed (even none), 2 error.

` + jsonFields + `
`

func listCmd(args []string, globalBackend backendFlag, stdout, stderr io.Writer) int {
	const cmd = "list"
	f := newOpsFlags(cmd, globalBackend, true, true)
	operands, code, ok := f.parse(args, stdout, stderr, listHelp)
	if !ok {
		return code
	}
	prefix := ""
	switch len(operands) {
	case 0:
	case 1:
		prefix = operands[0]
	default:
		errorf(stderr, cmd, "%q after PREFIX: one PREFIX only (usage: lockctl list [flags] [PREFIX])", operands[1])
		return exitUsage
	}
	// As locker.List checks it, but before connecting.
	if err := locker.CheckPrefix(prefix); err != nil {
		errorf(stderr, cmd, "PREFIX: %v", err)
		return exitUsage
	}
	p := f.open(cmd, stdout, stderr)
	if p == nil {
		return exitUsage
	}
	defer p.client.Close()
	ctx, cancel := p.ctx()
	defer cancel()
	ss, err := p.client.List(ctx, prefix, p.obj...)
	if err != nil {
		return p.fail(err, "cannot enumerate its "+p.noun+"s (lockctl status NAME reads one)")
	}
	if f.json {
		out := make([]jsonState, len(ss))
		for i, s := range ss {
			out[i] = toJSON(s)
		}
		writeJSON(stdout, out)
		return 0
	}
	if len(ss) == 0 {
		if prefix == "" {
			errorf(stderr, cmd, "no held %ss on %s", p.noun, p.store)
		} else {
			errorf(stderr, cmd, "no held %ss with prefix %q on %s", p.noun, prefix, p.store)
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if p.obj != nil {
		fmt.Fprintln(tw, "NAME\tFENCE\tOWNER\tHOLDS\tTIME LEFT")
		for _, s := range ss {
			for _, h := range s.Holders {
				fmt.Fprintf(tw, "%s\t%s\n", show(s.Name), holderRow(s, h, p.noun))
			}
		}
		tw.Flush()
		return 0
	}
	fmt.Fprintln(tw, "NAME\tOWNER\tFENCE\tTIME LEFT")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", show(s.Name), showOwner(s), showFence(s), showTTL(s))
	}
	tw.Flush()
	return 0
}

const releaseHelp = `usage: lockctl release --force [--fence N] [--semaphore | --rw] [--backend URL] [--timeout D] NAME

A lock is released by its holder (lockctl run releases its lock when
COMMAND exits). release --force is the operator's break-glass for a lock
whose holder is stuck: it removes the holder that lockctl status shows,
and only that one (given --fence N, only if its fence is N), so that a
holder that changed in between is never removed. It then prints the
removed holder's fence and the next one, which is greater: a resource that
checks fences refuses the removed holder's writes once it has seen the
next fence. The removed holder learns of the loss by its next refresh.

With --semaphore (--rw) and --fence N, which they require, it removes the
one holder of the semaphore's permits (the read-write lock's reader or
writer) whose fence is N, as lockctl status --semaphore (--rw) lists
them; the other holders keep theirs.

Exit status: 0 removed; 1 not removed (the lock is free, --fence differs,
or the holder changed); 2 error.

`

func releaseCmd(args []string, globalBackend backendFlag, stdout, stderr io.Writer) int {
	const cmd = "release"
	f := newOpsFlags(cmd, globalBackend, false, true)
	force := f.fs.Bool("force", false, "remove another holder's lock (break-glass); required")
	fenceArg := f.fs.String("fence", "", "remove the holder only if its fence is `N` (as lockctl status showed it)")
	operands, code, ok := f.parse(args, stdout, stderr, releaseHelp)
	if !ok {
		return code
	}
	if !*force {
		errorf(stderr, cmd, "a lock is released by its holder (lockctl run releases it when COMMAND exits); "+
			"to remove another holder's lock, break-glass: lockctl release --force NAME [--fence N]")
		return exitUsage
	}
	var want uint64
	fenceSet := *fenceArg != ""
	if fenceSet {
		var err error
		want, err = strconv.ParseUint(*fenceArg, 10, 64)
		if err != nil {
			errorf(stderr, cmd, "--fence %q: want a fence, a decimal number as lockctl status shows it", *fenceArg)
			return exitUsage
		}
	}
	name, err := oneName(operands, "lockctl release --force [--fence N] NAME")
	if err != nil {
		errorf(stderr, cmd, "%v", err)
		return exitUsage
	}
	if (f.semaphore || f.rw) && !fenceSet {
		errorf(stderr, cmd, "--semaphore and --rw need --fence N: which of the holders to remove (lockctl status --semaphore or --rw NAME lists them)")
		return exitUsage
	}
	p := f.open(cmd, stdout, stderr)
	if p == nil {
		return exitUsage
	}
	defer p.client.Close()
	if p.obj != nil {
		return p.releaseHolder(name, want)
	}
	return p.forceRelease(name, want, fenceSet)
}

// releaseHolder removes the holder with fence want of a semaphore or a
// read-write lock.
func (p *ops) releaseHolder(name string, want uint64) int {
	ctx, cancel := p.ctx()
	defer cancel()
	removed, err := p.client.ForceRelease(ctx, name, want, p.obj...)
	switch {
	case errors.Is(err, locker.ErrNotHeld):
		fmt.Fprintf(p.stdout, "no holder of the %s %s has fence %d: nothing changed; see lockctl status\n", p.noun, show(name), want)
		return exitFree
	case err != nil:
		return p.fail(err, "cannot remove another client's "+p.noun+" holder")
	}
	what := "the holder"
	if len(removed.Holders) == 1 {
		h := removed.Holders[0]
		what = fmt.Sprintf("the holder of %s with %s", holds(h, p.noun), holder(locker.State{Owner: h.Owner, Fence: h.Fence, Known: removed.Known | locker.KnowsFence}))
	}
	fmt.Fprintf(p.stdout, "released one holder of the %s %s: removed %s\n", p.noun, show(name), what)
	fmt.Fprintf(p.stdout, "  the others keep theirs; the removed holder learns of the loss by its next refresh, and the next grant's fence is above %d\n", want)
	return 0
}

func (p *ops) forceRelease(name string, want uint64, fenceSet bool) int {
	ctx, cancel := p.ctx()
	defer cancel()
	s, err := p.client.Inspect(ctx, name)
	if err != nil {
		return p.fail(err, "cannot read a lock's state, so lockctl cannot tell which holder it would remove")
	}
	if !s.Held {
		fmt.Fprintf(p.stdout, "%s is free on %s: nothing to release\n", show(name), p.store)
		return exitFree
	}
	if !s.Known.Has(locker.KnowsFence) {
		errorf(p.stderr, p.cmd, "the %s backend does not report the holder's fence, so it cannot remove that holder only", p.scheme)
		return exitUsage
	}
	if fenceSet && s.Fence != want {
		by := ""
		if s.Known.Has(locker.KnowsOwner) {
			by = " by " + holder(locker.State{Owner: s.Owner, Known: locker.KnowsOwner})
		}
		fmt.Fprintf(p.stdout, "%s is held under fence %d%s, not --fence %d: nothing changed\n", show(name), s.Fence, by, want)
		return exitFree
	}
	hook("inspected")
	ctx, cancel = p.ctx()
	defer cancel()
	removed, err := p.client.ForceRelease(ctx, name, s.Fence)
	switch {
	case errors.Is(err, locker.ErrNotHeld):
		fmt.Fprintf(p.stdout, "%s changed hands (or was released) since it was read under fence %d: nothing changed; see lockctl status\n", show(name), s.Fence)
		return exitFree
	case err != nil:
		return p.fail(err, "cannot remove another client's lock")
	}
	fmt.Fprintf(p.stdout, "released %s: removed the holder with %s\n", show(name), holder(removed))
	fmt.Fprintln(p.stdout, "  the removed holder learns of the loss by its next refresh (its Lost channel closes)")

	hook("removed")
	// The next fence, for the operator to check against what the removed
	// holder may still write.
	ctx, cancel = p.ctx()
	defer cancel()
	l, err := p.client.TryAcquire(ctx, name, locker.TTL(probeTTL), locker.Label(probeOwner))
	switch {
	case err == nil:
		next := l.Fence()
		relErr := l.Release(ctx)
		fmt.Fprintf(p.stdout, "  next fence: %d (taken by %s and released at once)\n", next, probeOwner)
		if relErr != nil {
			errorf(p.stderr, p.cmd, "releasing the probe: %v (it expires within %v)", relErr, probeTTL)
		}
		return p.checkNext(removed.Fence, next)
	case errors.Is(err, locker.ErrNotAcquired):
		// A waiter took the lock first.
		n, ierr := p.client.Inspect(ctx, name)
		switch {
		case ierr != nil:
			errorf(p.stderr, p.cmd, "the next holder took %s, but reading it failed: %v", show(name), ierr)
			return 0
		case !n.Held:
			fmt.Fprintf(p.stdout, "  next fence: not granted yet (a queued waiter is next; its fence will be above %d)\n", removed.Fence)
			return 0
		case !n.Known.Has(locker.KnowsFence):
			fmt.Fprintf(p.stdout, "  next holder: %s (fence unknown)\n", holder(n))
			return 0
		}
		fmt.Fprintf(p.stdout, "  next fence: %d (a waiter took the lock: %s)\n", n.Fence, holder(n))
		return p.checkNext(removed.Fence, n.Fence)
	default:
		errorf(p.stderr, p.cmd, "the holder was removed, but probing the next fence failed: %v", err)
		return 0
	}
}

// checkNext reports a next fence that is not above the removed one: the
// store broke its promise, and the operator must know.
func (p *ops) checkNext(removed, next uint64) int {
	if next > removed {
		return 0
	}
	errorf(p.stderr, p.cmd, "the next fence %d is not above the removed holder's %d: the store does not fence correctly", next, removed)
	return exitUsage
}

// versionInfo is what lockctl version prints.
type versionInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

func readVersion() versionInfo {
	v := versionInfo{Version: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module, v.Go = bi.Main.Path, bi.GoVersion
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("lockctl version")
	asJSON := fs.Bool("json", false, "print JSON: module, version, revision, time, modified, go, platform")
	if code, ok := fs.parse(args, "usage: lockctl version [--json]\n\n", stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		errorf(stderr, "version", "takes no arguments")
		return exitUsage
	}
	v := readVersion()
	if *asJSON {
		writeJSON(stdout, v)
		return 0
	}
	line := "lockctl " + v.Version
	if v.Module != "" {
		line += " (" + v.Module + ")"
	}
	if v.Revision != "" {
		line += " revision " + v.Revision
		if v.Modified {
			line += "+modified"
		}
	}
	if v.Time != "" {
		line += " " + v.Time
	}
	fmt.Fprintf(stdout, "%s %s %s\n", line, v.Go, v.Platform)
	return 0
}

const resizeHelp = `usage: lockctl resize [--backend URL] [--timeout D] NAME N

Sets the limit of the semaphore NAME (lockctl run --limit) to N while it is
in use, whatever limit its runs ask for, until the next resize; N 0 removes
it, and the runs' own --limit rules again. Holders above a lowered limit
keep their permits until they finish; new runs wait until the holders are
within it. A raised limit lets waiting runs in at once. Then it prints the
semaphore's state, as lockctl status --semaphore does.

Exit status: 0 set; 2 error.

`

func resizeCmd(args []string, globalBackend backendFlag, stdout, stderr io.Writer) int {
	const cmd = "resize"
	f := newOpsFlags(cmd, globalBackend, false, false)
	operands, code, ok := f.parse(args, stdout, stderr, resizeHelp)
	if !ok {
		return code
	}
	const use = "lockctl resize [flags] NAME N"
	if len(operands) != 2 {
		errorf(stderr, cmd, "want NAME and N, got %d operands (usage: %s)", len(operands), use)
		return exitUsage
	}
	name, err := oneName(operands[:1], use)
	if err != nil {
		errorf(stderr, cmd, "%v", err)
		return exitUsage
	}
	n, err := strconv.Atoi(operands[1])
	if err != nil || n != 0 && locker.CheckLimit(n) != nil {
		errorf(stderr, cmd, "N %q: want 1 to %d, or 0 to remove the limit resize set", operands[1], locker.MaxLimit)
		return exitUsage
	}
	p := f.open(cmd, stdout, stderr)
	if p == nil {
		return exitUsage
	}
	defer p.client.Close()
	return p.resize(name, n)
}

func (p *ops) resize(name string, n int) int {
	ctx, cancel := p.ctx()
	defer cancel()
	if err := p.client.Resize(ctx, name, n); err != nil {
		return p.fail(err, "cannot keep a semaphore's limit")
	}
	if n == 0 {
		fmt.Fprintf(p.stdout, "%s: the limit set by resize is removed; the runs' own --limit rules again\n", show(name))
	} else {
		fmt.Fprintf(p.stdout, "%s: limit %d, until the next resize\n", show(name), n)
	}
	sem := locker.Semaphore(0)
	if s, err := p.client.Inspect(ctx, name, sem); err == nil {
		printHolders(p.stdout, s, "semaphore", p.store)
	}
	return 0
}
