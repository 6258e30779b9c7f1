package backend

import (
	"strings"
	"testing"
)

func TestEscapeKey(t *testing.T) {
	cases := map[string]string{
		"locker/a":   "locker%2Fa",
		".":          "%2E",
		"..":         "%2E%2E",
		"a.b":        "a.b",
		"sp ace{}:%": "sp%20ace%7B%7D%3A%25",
		"ü":          "%C3%BC",
		"x\x01y":     "x%01y",
	}
	for in, want := range cases {
		if got := EscapeKey(in); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", in, got, want)
		}
	}
	seen := map[string]string{}
	for _, k := range []string{"a/b", "a%2Fb", "a", "a/", "/a", ".", "..", "%2E"} {
		e := EscapeKey(k)
		if prev, dup := seen[e]; dup {
			t.Errorf("EscapeKey(%q) = EscapeKey(%q) = %q", k, prev, e)
		}
		seen[e] = k
	}
}

func TestShortKey(t *testing.T) {
	long := strings.Repeat("ü", MaxKeyLen/2)
	a, b := ShortKey(long, 250), ShortKey(long+"x", 250)
	if len(a) != 250 || len(b) != 250 || a == b {
		t.Fatalf("ShortKey: len %d and %d, equal %v", len(a), len(b), a == b)
	}
	if got := ShortKey("ns/short", 250); got != "ns%2Fshort" {
		t.Fatalf("ShortKey(short) = %q", got)
	}
}
