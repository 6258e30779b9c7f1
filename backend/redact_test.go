package backend

import (
	"net/url"
	"strings"
	"testing"
)

func TestRedacted(t *testing.T) {
	const canary = "Canary9x"
	for _, raw := range []string{
		"redis://alice:" + canary + "@h:6379/0",
		"postgres://u@h/db?password=" + canary + "&sslmode=verify-full",
		"postgres://u@h/db?sslpassword=" + canary,
		"etcd://h?PassWord=" + canary,
		"x://h?auth_token=" + canary + "&client_secret=" + canary + "&apikey=" + canary,
		"x://h?a=1&password=" + canary + "&password=" + canary,
		"x://h?password=%zz" + canary, // a query that does not parse
		"redis:" + canary + "@h:6379", // no "//": the user info is in Opaque
		"redis:alice:" + canary + "@h:6379",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		got := Redacted(u)
		if strings.Contains(got, canary) {
			t.Errorf("Redacted(%q) = %q: the secret shows", raw, got)
		}
		if !strings.Contains(got, "xxxxx") {
			t.Errorf("Redacted(%q) = %q: no sign of what was hidden", raw, got)
		}
		if s := RedactedString(raw); s != got {
			t.Errorf("RedactedString(%q) = %q, want %q", raw, s, got)
		}
	}
	for _, raw := range []string{
		"rediss://h:6379/0?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&server_name=r",
		"postgres://u@h/db?sslmode=verify-full&sslkey=/k.pem&sslrootcert=/ca.pem",
	} {
		u, _ := url.Parse(raw)
		if got := Redacted(u); got != raw {
			t.Errorf("Redacted(%q) = %q: nothing there is secret", raw, got)
		}
	}
	if got := RedactedString("redis://a:" + canary + "@h\x7f"); strings.Contains(got, canary) {
		t.Errorf("an unparsable URL printed its password: %q", got)
	}
	if Redacted(nil) != "" {
		t.Error("Redacted(nil) is not empty")
	}
}

func TestScrub(t *testing.T) {
	const canary = "Canary/9 x"
	u, err := url.Parse("postgres://u:" + url.PathEscape(canary) + "@h/db?sslpassword=" + url.QueryEscape(canary) + "&sslmode=require")
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"cannot parse password " + canary,
		"dial postgres://u:" + url.PathEscape(canary) + "@h/db",
		"bad sslpassword=" + url.QueryEscape(canary),
	} {
		if got := Scrub(text, u); strings.Contains(got, "Canary") || !strings.Contains(got, "xxxxx") {
			t.Errorf("Scrub(%q) = %q", text, got)
		}
	}
	if got := Scrub("sslmode=require", u); got != "sslmode=require" {
		t.Errorf("Scrub changed a text without secrets: %q", got)
	}
}
