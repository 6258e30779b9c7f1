//go:build unix

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode"
)

// flagSet is the flags of lockctl or of one of its commands: the standard
// library's FlagSet, shown and reported as GNU and flock(1) users expect
// (--name, short forms beside their long names, getopt's -xn and -w5),
// with one handling of -h/--help and of errors for every command.
type flagSet struct {
	*flag.FlagSet
	cmd   string            // "lockctl run", for messages
	short map[string]string // long name -> its short form
}

func newFlagSet(cmd string) *flagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, cmd: cmd, short: map[string]string{}}
}

// alias makes short another name of the flag long.
func (f *flagSet) alias(short, long string) {
	l := f.Lookup(long)
	f.Var(l.Value, short, l.Usage)
	f.short[long] = short
}

// duration defines a duration flag that also takes bare seconds, as flock's
// -w does: 5 is 5s, 1.5 is 1.5s; 300ms, 2m and 1h keep their units.
func (f *flagSet) duration(p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	f.Var((*durationValue)(p), name, usage)
}

type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	if s != "" && !strings.ContainsFunc(s, unicode.IsLetter) {
		s += "s"
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want seconds (5, 1.5) or a duration with a unit (300ms, 2m, 1h)")
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return time.Duration(*d).String() }

// isSet reports whether the flag long was given, by either of its names.
func (f *flagSet) isSet(long string) bool {
	set := false
	f.Visit(func(fl *flag.Flag) { set = set || fl.Name == long || fl.Name == f.short[long] })
	return set
}

// parse parses args. For -h or --help it prints help and the flags on
// stdout and returns status 0 and false; for a bad flag one line on
// stderr and exitUsage and false.
func (f *flagSet) parse(args []string, help string, stdout, stderr io.Writer) (int, bool) {
	err := f.Parse(f.unbundle(args))
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, help)
		f.printFlags(stdout)
		return 0, false
	default:
		fmt.Fprintf(stderr, "%s: %s (see %s -h)\n", f.cmd, f.reword(err), f.cmd)
		return exitUsage, false
	}
}

// unbundle splits getopt's bundled short flags (-xn: -x -n; -w5: -w 5)
// up to the first operand or "--": the flag package takes one flag per
// argument. An argument that names a flag (-ttl) is left as it is.
func (f *flagSet) unbundle(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return append(out, args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		split, takesNext := []string{a}, false
		if fl := f.Lookup(name); fl != nil || a[1] == '-' || hasValue {
			takesNext = fl != nil && !hasValue && !isBool(fl)
		} else if b, next, ok := f.bundle(a[1:]); ok {
			split, takesNext = b, next
		}
		out = append(out, split...)
		if takesNext && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// bundle splits s, the letters of a bundle, into short flags, the last of
// which takes the rest of s as its value, or else the next argument, if
// it takes a value. It returns false if a letter is no short flag.
func (f *flagSet) bundle(s string) (split []string, takesNext, ok bool) {
	for i, r := range s {
		fl := f.Lookup(string(r))
		if fl == nil || !slices.Contains(f.shortNames(), string(r)) {
			return nil, false, false
		}
		split = append(split, "-"+string(r))
		if !isBool(fl) {
			if rest := s[i+len(string(r)):]; rest != "" {
				return append(split, rest), false, true
			}
			return split, true, true
		}
	}
	return split, false, true
}

func (f *flagSet) shortNames() []string {
	var s []string
	for _, v := range f.short {
		s = append(s, v)
	}
	return s
}

func isBool(fl *flag.Flag) bool {
	b, ok := fl.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// dashed writes a flag name as it is typed: -n, --no-wait.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// reword says the flag package's errors with the names as typed.
func (f *flagSet) reword(err error) string {
	msg := err.Error()
	if n, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag " + dashed(n)
	}
	if n, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return dashed(n) + " needs a value"
	}
	// invalid value "x" for flag -name: why; invalid boolean value "x" for -name: why
	_, rest, ok := strings.Cut(msg, "value ")
	i := strings.LastIndex(rest, " for ")
	if !ok || !strings.HasPrefix(msg, "invalid ") || i < 0 {
		return msg
	}
	value := rest[:i]
	name, why, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(rest[i:], " for "), "flag "), ": ")
	name = strings.TrimPrefix(name, "-")
	switch why {
	case "parse error":
		why = "want a whole number"
		if fl := f.Lookup(name); fl != nil && isBool(fl) {
			why = "want true or false"
		}
	case "value out of range":
		why = "out of range"
	}
	return fmt.Sprintf("%s %s: %s", dashed(name), value, why)
}

// printFlags lists the flags, short form first, values named as in their
// usage (`URL`), durations D, numbers N.
func (f *flagSet) printFlags(w io.Writer) {
	isShort := map[string]bool{}
	for _, s := range f.short {
		isShort[s] = true
	}
	type row struct{ names, usage string }
	rows := []row{}
	f.VisitAll(func(fl *flag.Flag) {
		if isShort[fl.Name] {
			return
		}
		arg, usage := flag.UnquoteUsage(fl)
		switch {
		case isBool(fl):
			arg = ""
		case arg == "value" || arg == "duration":
			arg = "D"
		case arg == "int" || arg == "uint":
			arg = "N"
		case arg == "string":
			arg = "S"
		}
		names := "    " + dashed(fl.Name)
		if s, ok := f.short[fl.Name]; ok {
			names = dashed(s) + ", " + dashed(fl.Name)
		}
		if arg != "" {
			names += " " + arg
		}
		if def := fl.DefValue; def != "" && def != "false" && def != "0" && def != "0s" {
			usage += " (default " + def + ")"
		}
		rows = append(rows, row{names, usage})
	})
	rows = append(rows, row{"-h, --help", "print this help"})
	const col = 26
	fmt.Fprintln(w, "Flags:")
	for _, r := range rows {
		lines := strings.Split(r.usage, "\n")
		if len(r.names) < col-3 {
			fmt.Fprintf(w, "  %-*s%s\n", col-2, r.names, lines[0])
			lines = lines[1:]
		} else {
			fmt.Fprintf(w, "  %s\n", r.names)
		}
		for _, l := range lines {
			fmt.Fprintf(w, "%*s%s\n", col, "", l)
		}
	}
}
