//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lockerhq/locker/internal/testenv"
)

// enter is each COMMAND of TestLimitAndShared: it marks itself inside,
// counts who is inside (its own mark included), logs "kind all readers
// writers", stays a while and leaves. A run that entered too early sees
// the marks of those still inside.
const enter = `touch "$D/in/$K.$$"
n=$(ls "$D/in" | wc -l); r=$(ls "$D/in" | grep -c '^r\.'); w=$(ls "$D/in" | grep -c '^w\.')
echo "$K $n $r $w" >> "$D/log"
sleep 0.2
rm "$D/in/$K.$$"`

// TestLimitAndShared: real lockctl processes on every backend, checked by
// the COMMANDs themselves: 10 runs with --limit 3 never have more than 3
// inside (and more than one at times); 6 --shared and 2 --exclusive runs
// of one name never have a writer with anyone else inside.
func TestLimitAndShared(t *testing.T) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			if len(tg.addrs) > 0 {
				testenv.Require(t, tg.addrs...)
			}
			u := tg.url(t)
			lines := runAll(t, tg, u, "limit", 10, func(int) (string, []string) { return "p", []string{"--limit", "3"} })
			most := 0
			for _, l := range lines {
				most = max(most, l[1])
				if l[1] > 3 {
					t.Errorf("%d COMMANDs inside with --limit 3", l[1])
				}
			}
			if most < 2 {
				t.Errorf("never more than %d COMMAND inside with --limit 3: it acts as a lock", most)
			}

			lines = runAll(t, tg, u, "rw", 8, func(i int) (string, []string) {
				if i%4 == 1 {
					return "w", []string{"--exclusive"}
				}
				return "r", []string{"--shared"}
			})
			readers := 0
			for _, l := range lines {
				if l[0] == 'w' && l[1] != 1 {
					t.Errorf("an --exclusive COMMAND ran with %d others inside", l[1]-1)
				}
				if l[0] == 'r' && l[3] != 0 {
					t.Errorf("a --shared COMMAND ran with a writer inside")
				}
				readers = max(readers, l[2])
			}
			if readers < 2 {
				t.Errorf("never more than %d --shared COMMAND inside: readers do not share", readers)
			}
		})
	}
}

// runAll starts n `lockctl run --wait 60s` processes of name at once, the
// i-th with the kind and flags that mode(i) gives, waits for them, and
// returns the COMMANDs' log lines as [kind, inside, readers, writers].
func runAll(t *testing.T, tg target, u, name string, n int, mode func(int) (string, []string)) [][4]int {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		kind, flags := mode(i)
		args := append(append(append([]string{"run"}, common(tg, u)...), flags...), "--wait", "60s", name, "--", "sh", "-c", enter)
		p := lockctlProc(args...)
		p.Env = append(p.Env, "D="+dir, "K="+kind)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := p.Wait(); err != nil {
				t.Errorf("lockctl run %s: %v; stderr:\n%s", strings.Join(flags, " "), err, &p.stderr)
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][4]int
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("log line %q", line)
		}
		var l [4]int
		l[0] = int(f[0][0])
		for i := 1; i < 4; i++ {
			l[i], _ = strconv.Atoi(f[i])
		}
		out = append(out, l)
	}
	if len(out) != n {
		t.Errorf("%d COMMANDs ran, want %d", len(out), n)
	}
	return out
}

// TestRunWeight: --weight K takes K of the N permits at once: beside a
// run that holds 2 of 3, a run asking for 2 is refused (75), one asking
// for 1 runs.
func TestRunWeight(t *testing.T) {
	t.Parallel()
	u := fileURL(t)
	for k, want := range map[string]int{"2": exitNotAcquired, "1": 0} {
		p := lockctlProc("run", "--backend", u, "--limit", "3", "--weight", "2", "-n", "job", "--",
			lockctlBin, "run", "--backend", u, "--limit", "3", "--weight", k, "-n", "job", "--", "true")
		if code, _ := p.status(t); code != want {
			t.Errorf("--weight %s beside a holder of 2 of 3: exit %d, want %d; stderr:\n%s", k, code, want, &p.stderr)
		}
	}
}
