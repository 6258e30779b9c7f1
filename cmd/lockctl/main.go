//go:build unix

// Command lockctl runs a command under a lock, on any backend, shows and
// operates locks, and compares backends side by side.
//
//	lockctl run [-n | -w D] [-s | -x | --limit N [--weight K]] [--ttl D] [--min-hold D]
//	            [--quiet-busy | -E CODE] [--owner ID] [flags] NAME -- COMMAND [ARG...]
//	lockctl status [--json] NAME
//	lockctl list [--json] [PREFIX]
//	lockctl release --force [--fence N] NAME
//	lockctl doctor [--ttl D] [--json]
//	lockctl backends
//	lockctl bench [--backends URL,URL,...] [--json FILE] [--svg FILE]
//	lockctl version [--json]
//
// Flags are written --name (one dash works too); run also takes flock(1)'s
// short forms, bundled as getopt takes them (-xn, -w5). Durations are bare
// seconds as flock's -w takes them (5, 1.5) or have a unit (300ms, 2m, 1h).
// Every command prints its help and every flag on stdout for -h or --help,
// and exits 0.
//
// The backend is the URL given with --backend, else $LOCKER_URL. Every
// backend is compiled in; only the URL changes between environments:
//
//	LOCKER_URL=file:///var/lib/myapp/locks                  # one machine
//	LOCKER_URL=redis://cache.staging:6379/0                 # staging
//	LOCKER_URL=etcd://etcd-1:2379,etcd-2:2379,etcd-3:2379   # production
//
// lockctl never locks somewhere else silently. An empty --backend, or a
// LOCKER_URL that is set but empty, is refused (exit 2): it is a variable
// gone missing, not a choice. With neither set, lockctl uses the file
// backend in a directory under the user's cache directory (see
// filelock.DefaultDir), which excludes processes of this host only, and says
// so on stderr once per run:
//
//	lockctl: no --backend or LOCKER_URL: locking on this host only (file:///home/me/.cache/lockctl)
//
// A cron job meant for one host names that store, --backend file:// (or
// LOCKER_URL=file://: file:// without a directory is the default one), and
// gets no note; --quiet-busy does not silence it, since a job run from cron
// on several hosts is who needs it. -v, every busy message and status name
// the store (its URL, with passwords and secret parameters as xxxxx).
//
// Secrets need not be written in the URL: lockctl replaces ${NAME} in it by
// the environment variable NAME, percent-encoded so that any password fits
// in the user information (and the password never shows in ps):
//
//	LOCKER_URL='redis://:${REDIS_PASSWORD}@cache.staging:6379/0'
//
// Backends may also read their own variables (etcd: ETCD_PASSWORD with a
// user and no password; PostgreSQL: PGPASSWORD and ~/.pgpass).
//
// # run
//
// run acquires NAME, waiting until it is free (like flock(1)) unless --wait
// bounds the wait or --no-wait forbids it. It then runs COMMAND with
// LOCKER_NAME (the name) and LOCKER_FENCE (the decimal fencing token, strictly
// greater for every new holder of the name) in its environment, keeps the
// lock refreshed while COMMAND runs, releases it when COMMAND exits, and
// exits with COMMAND's status. COMMAND runs in a process group of its own
// (the terminal's foreground group when lockctl had the terminal).
//
// If the lock is lost while COMMAND runs (refreshes found it taken, or its
// TTL ran out while lockctl could not refresh, e.g. when it was stopped),
// lockctl says so on stderr, sends SIGTERM to COMMAND's process group, then
// SIGKILL after --grace, and exits 76. SIGINT, SIGTERM and SIGHUP sent to
// lockctl are passed on to COMMAND's process group; the lock is released
// once COMMAND has exited.
//
// COMMAND never outlives the lock: if lockctl dies while COMMAND runs, by
// any signal (SIGKILL included) or a crash, a guardian process that lockctl
// starts before COMMAND (a copy of lockctl, in a process group of its own,
// shown by ps as lockctl-guardian) sends SIGTERM to COMMAND's process group,
// then SIGKILL after --grace or before the lock can expire, whichever comes
// first. The guardian learns of lockctl's death from a pipe only lockctl
// writes, which the kernel closes when lockctl dies, and of the lock's
// deadline from lockctl after each refresh. It exits with lockctl. A kill
// that takes the guardian with lockctl but spares COMMAND (pkill -9 -f
// lockctl; killall -9 lockctl except on Linux, where the guardian's
// process name is "exe") leaves COMMAND running. COMMAND starts as a gate
// (lockctl again, with COMMAND's PID, group and files) that execs COMMAND
// only once the guardian knows its group, and exits if lockctl dies first.
//
// Flags of run:
//
//	    --backend URL          the lock store (default $LOCKER_URL, else this host only)
//	    --ttl D                lock TTL (default 30s): how long a crashed holder blocks others;
//	                           on ZooKeeper the session timeout, unless the URL sets session_timeout
//	-w, --wait D               give up after waiting D (default: wait forever)
//	-n, --no-wait              give up at once if the lock is held
//	-E, --conflict-exit-code CODE
//	                           exit CODE (0 to 255) instead of 75 when another holder has the lock
//	    --min-hold D           keep the lock held at least D from its acquisition (see below)
//	    --limit N              take one of N permits of the semaphore NAME
//	    --weight K             with --limit: take K of the N permits at once, all or none
//	-s, --shared               take the read side of the read-write lock NAME
//	-x, --exclusive            take its write side
//	    --quiet-busy           with -n or -w: exit 0, silently, when another holder has it
//	    --owner ID             holder identity, see below
//	    --grace D              after a lost lock, SIGKILL this long after SIGTERM (default 10s)
//	    --connect-timeout D    bound on connecting to the backend (default 10s)
//	-v, --verbose              name the store, and report the acquisition and release, on stderr
//
// As with flock, -s and -x are the two sides of one read-write lock; unlike
// flock, a run without either takes a plain lock NAME, which is another
// object: all runs of a name say -s or -x, or none does.
//
// --owner names the holder. It is stored with the lock where the backend
// keeps such information (the file backend does) and is passed to COMMAND as
// LOCKER_OWNER. It also makes nested runs reentrant: a lockctl run started
// (directly or not) by COMMAND, for the same NAME, the same --owner and the
// same backend URL, finds itself inside the outer hold through LOCKER_NAME,
// LOCKER_OWNER and LOCKER_BACKEND_ID, and runs its COMMAND at once under the
// outer lock (same fence) instead of waiting for itself forever. Without
// --owner, or with a different one, a nested run is a new holder and waits
// like any other process. Two unrelated lockctl processes never share a
// hold, whatever their owner. A reentrant run starts its COMMAND in its own
// process group (the enclosing COMMAND's), so that the enclosing run's
// signals reach it.
//
// --min-hold D keeps the lock held for at least D from its acquisition,
// however soon COMMAND ends: released earlier, it stays in the store,
// unrefreshed, until D has passed (locker.MinHold), and -v says until when.
// On ZooKeeper, whose locks live as long as their session, lockctl stays
// until then. With it, a job that cron starts on several hosts runs once
// even when it ends before the slowest host's clock reaches the schedule:
//
//	lockctl run --no-wait --quiet-busy --min-hold 5m --ttl 10m job -- /path/job
//
// Signals reach COMMAND's process group only: processes that COMMAND moves
// into groups of their own (a nested, non-reentrant lockctl run does so for
// its COMMAND) get SIGTERM passed on by that nested run, but escape the
// SIGKILL that follows --grace.
//
// Exit status of run: COMMAND's own status when it ran and the lock held;
// 128+N when COMMAND was killed by signal N (as shells report it); 75 when
// the lock was not acquired (--no-wait, or --wait ran out; -E CODE changes
// it when another holder has the lock, as flock's -E does); 76 when the lock
// was lost while COMMAND ran; 127 when COMMAND could not be started (the
// lock is released); 2 for every error before COMMAND runs (bad flags or
// name, unknown scheme, unreachable server: one line on stderr); 128+N when
// lockctl itself is interrupted by signal N while waiting for the lock.
// With --quiet-busy, a lock another holder has (75 otherwise) exits 0 and
// prints nothing, for cron mailers; other errors keep their status. Without
// it, the busy message names the holder (where the store records it) and
// the store, with --wait as with --no-wait.
//
// # status, list, release --force
//
// status prints what the store knows of NAME: held or free and, where the
// store records them, the holder's owner, fence and time left, and the
// waiters queued behind it, then the store it asked (store:); a field the
// store does not record is "unknown", never guessed. It exits 0 when NAME is held, 1 when free.
// list prints the held locks whose names start with PREFIX, in columns;
// a backend whose store cannot enumerate its keys (memcached) refuses.
// With --json, status prints one object and list an array of them: name
// and held always; owner, fence, ttl_ms (time left in milliseconds),
// waiters and queue only when the store reported them.
//
// release --force is the operator's break-glass for a lock whose holder is
// stuck: it removes the holder status shows, and only that one (with
// --fence N, only if its fence is N), prints the removed holder's fence and
// the next one, which is greater, and exits 0; it exits 1, changing
// nothing, when NAME is free, --fence differs or the holder changed in
// between. The removed holder learns of the loss by its next refresh.
// Without --force, release refuses: a lock is released by its holder.
//
// These commands take --backend and --timeout (bound on connecting and on
// each call, default 10s), and exit 2 on bad input (before connecting)
// and on errors, among them a backend that cannot do what was asked.
//
// lockctl runs on Unix systems (Linux, macOS, the BSDs): it relies on
// process groups and signals.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"

	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/filelock"

	// Every backend, so that one binary talks to all of them.
	_ "github.com/lockerhq/locker/etcdlock"
	_ "github.com/lockerhq/locker/memcachelock"
	_ "github.com/lockerhq/locker/memlock"
	_ "github.com/lockerhq/locker/redislock"
	_ "github.com/lockerhq/locker/sqllock"
	_ "github.com/lockerhq/locker/sqllock/mysql"
	_ "github.com/lockerhq/locker/sqllock/sqlite"
	_ "github.com/lockerhq/locker/zklock"
)

// Exit statuses.
const (
	exitUsage       = 2   // an error before COMMAND runs
	exitNotAcquired = 75  // EX_TEMPFAIL: try again later
	exitLost        = 76  // the lock was lost while COMMAND ran
	exitNoCommand   = 127 // COMMAND could not be started
)

// envURL names the environment variable with the backend URL.
const envURL = "LOCKER_URL"

const usage = `usage:
  lockctl run [-n | -w D] [-s | -x | --limit N [--weight K]] [flags] NAME... -- COMMAND [ARG...]
                                               run COMMAND under the lock NAME (or all NAMEs)
  lockctl status [--json] NAME                 who holds NAME (exit 0 held, 1 free)
  lockctl list [--json] [PREFIX]               the held locks
  lockctl status --semaphore | --rw NAME       a semaphore's or read-write lock's holders
  lockctl release --force [--fence N] NAME     break-glass: remove a stuck holder
  lockctl resize NAME N                        set the limit of the semaphore NAME in use
  lockctl doctor [--ttl D] [--json]            what in the deployment could break a lock
  lockctl backends                             the backends' URL forms
  lockctl bench [--backends URL,URL,...] [--json FILE] [--svg FILE] [...]
  lockctl version [--json]

The backend is --backend URL, else $LOCKER_URL. With neither, lockctl locks
on this host only, in %s,
and says so on stderr; --backend file:// (or LOCKER_URL=file://) names that
store: no note.
${NAME} in the URL is replaced by the environment variable NAME (for secrets).
Durations are seconds (5, 1.5) or have a unit (300ms, 2m, 1h).
Run "lockctl COMMAND -h" for a command's flags.
Exit status 2: bad input or an error (one line on stderr).

`

func init() {
	// go-redis logs dial failures to stderr by itself; lockctl reports
	// errors once, in its own words.
	redis.SetLogger(quietLogger{})
}

func main() {
	if os.Getenv(envGuardian) == guardianMode {
		os.Exit(guardianMain())
	}
	if os.Getenv(envGate) == guardianMode {
		os.Exit(gateMain())
	}
	os.Exit(lockctl(os.Args[1:], os.Stdout, os.Stderr))
}

func lockctl(args []string, stdout, stderr io.Writer) int {
	global := newFlagSet("lockctl")
	var b backendFlag
	global.Var(&b, "backend", "the lock store's `URL`, for every command (default $LOCKER_URL)")
	help := fmt.Sprintf(usage, defaultURL())
	if code, ok := global.parse(args, help, stdout, stderr); !ok {
		return code
	}
	args = global.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, help)
		global.printFlags(stderr)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], b, stdout, stderr)
	case "status":
		return statusCmd(args[1:], b, stdout, stderr)
	case "list":
		return listCmd(args[1:], b, stdout, stderr)
	case "release":
		return releaseCmd(args[1:], b, stdout, stderr)
	case "resize":
		return resizeCmd(args[1:], b, stdout, stderr)
	case "version":
		return versionCmd(args[1:], stdout, stderr)
	case "backends":
		return backendsCmd(args[1:], stdout, stderr)
	case "bench":
		return benchCmd(args[1:], stdout, stderr)
	case "doctor":
		return doctorCmd(args[1:], b, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, help)
		global.printFlags(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "lockctl: unknown command %q (want run, status, list, release, resize, doctor, backends, bench or version)\n", args[0])
		return exitUsage
	}
}

// defaultURL is the backend used when none is configured.
func defaultURL() string {
	return (&url.URL{Scheme: "file", Path: filelock.DefaultDir()}).String()
}

// backendFlag is --backend: a URL given explicitly, and never empty (an
// empty one is a variable gone missing, not a choice).
type backendFlag struct {
	url string
	set bool
}

func (b *backendFlag) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("want a backend URL, not an empty one; file:// locks on this host only")
	}
	b.url, b.set = strings.TrimSpace(s), true
	return nil
}

// String shows no default: the one given before the command may hold a
// password.
func (b *backendFlag) String() string { return "" }

// resolveURL picks the backend URL: --backend, else $LOCKER_URL, else the
// file backend's default directory. That last one excludes processes of
// this host only, so it is said on stderr: a cron job started without its
// environment must not silently stop excluding other hosts. An empty
// $LOCKER_URL is refused as an empty --backend is. file:// without a
// directory names the default directory, without the note. ${NAME}
// references are left for expandURL.
func resolveURL(b backendFlag, stderr io.Writer) (string, error) {
	raw := b.url
	if !b.set {
		env, ok := os.LookupEnv(envURL)
		if !ok {
			def := defaultURL()
			fmt.Fprintf(stderr, "lockctl: no --backend or %s: locking on this host only (%s)\n", envURL, def)
			return def, nil
		}
		if raw = strings.TrimSpace(env); raw == "" {
			return "", fmt.Errorf("%s is set but empty: want a backend URL (file:// locks on this host only)", envURL)
		}
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme == "file" && u.Host == "" && u.Path == "" && u.Opaque == "" {
		u.Path = filelock.DefaultDir()
		raw = u.String()
	}
	return raw, nil
}

// expandURL replaces every ${NAME} in raw by the value of the environment
// variable NAME, percent-encoded except for letters, digits and "-._~", so
// that a secret with any characters fits in a URL's user information:
//
//	LOCKER_URL='redis://:${REDIS_PASSWORD}@cache:6379/0'
//
// keeps the password out of the URL, of lockctl's arguments (which ps
// shows) and of shell history. It also returns the names it replaced, which
// lockctl run keeps out of COMMAND's environment. A reference to an unset
// variable is an error; a '$' not followed by '{' is left alone.
func expandURL(raw string) (string, []string, error) {
	var b strings.Builder
	var names []string
	for {
		i := strings.Index(raw, "${")
		if i < 0 {
			b.WriteString(raw)
			return b.String(), names, nil
		}
		j := strings.IndexByte(raw[i:], '}')
		if j < 0 {
			return "", nil, fmt.Errorf("backend URL: unterminated ${ reference")
		}
		name := raw[i+2 : i+j]
		val, ok := os.LookupEnv(name)
		if name == "" || !ok {
			return "", nil, fmt.Errorf("backend URL refers to ${%s}, which is not set", name)
		}
		names = append(names, name)
		b.WriteString(raw[:i])
		b.WriteString(backend.EscapeKey(val))
		raw = raw[i+j+1:]
	}
}

func backendsCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("lockctl backends")
	if code, ok := fs.parse(args, "usage: lockctl backends\n\nLists the backends compiled in, with their URL forms.\n\n", stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "lockctl backends: takes no arguments\n")
		return exitUsage
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEME\tURL FORM")
	for _, s := range backend.Schemes() {
		fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Usage)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\nDefault (no --backend, no $%s; or file://): %s, this host only\n", envURL, defaultURL())
	return 0
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
