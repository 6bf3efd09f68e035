// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// helpFlag is one flag as a "Flags:" section of cobra's help prints it:
//
//	-o, --output string   Output format: table, json or yaml (default "table")
type helpFlag struct {
	Name      string
	Shorthand string
	// Type is pflag's name for the value ("string", "uint", "duration",
	// ...); empty for a bool.
	Type string
	// Default is the default as printed, unquoted; empty when pflag prints
	// none (the zero value).
	Default string
	Usage   string
}

// pflag ends a usage with ` (default "x")` for strings, ` (default x)`
// otherwise, and only when the default is not the zero value.
var defaultSuffix = regexp.MustCompile(`^(.*) \(default (.*)\)$`)

// helpSection returns the lines of the section titled title (such as
// "Flags:") of a help text, up to the blank line that ends it.
func helpSection(help, title string) []string {
	var lines []string
	in := false
	for line := range strings.SplitSeq(help, "\n") {
		switch {
		case line == title:
			in = true
		case in && strings.TrimSpace(line) == "":
			return lines
		case in:
			lines = append(lines, line)
		}
	}
	return lines
}

// parseFlags parses the lines of a "Flags:" section. pflag separates the
// flag from its usage by at least two spaces and indents the continuation
// lines of a multi-line usage.
func parseFlags(lines []string) ([]helpFlag, error) {
	var flags []helpFlag
	for _, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		if !strings.HasPrefix(trimmed, "-") {
			if len(flags) == 0 {
				return nil, fmt.Errorf("flag line expected, got %q", line)
			}
			flags[len(flags)-1].Usage += " " + strings.TrimSpace(trimmed)
			continue
		}
		spec, usage, _ := strings.Cut(trimmed, "  ")
		f := helpFlag{Usage: strings.TrimSpace(usage)}
		fields := strings.Fields(spec)
		if short, ok := strings.CutSuffix(fields[0], ","); ok {
			f.Shorthand = strings.TrimPrefix(short, "-")
			fields = fields[1:]
		}
		name, ok := strings.CutPrefix(fields[0], "--")
		if !ok || len(fields) > 2 {
			return nil, fmt.Errorf("cannot parse flag line %q", line)
		}
		f.Name = name
		if len(fields) == 2 {
			f.Type = fields[1]
		}
		if m := defaultSuffix.FindStringSubmatch(f.Usage); m != nil {
			f.Usage, f.Default = m[1], m[2]
			if f.Type == "string" {
				if s, err := strconv.Unquote(f.Default); err == nil {
					f.Default = s
				}
			}
		}
		flags = append(flags, f)
	}
	return flags, nil
}

// subcommands lists the commands of the "Available Commands:" section,
// without cobra's own help and completion.
func subcommands(help string) []string {
	var names []string
	for _, line := range helpSection(help, "Available Commands:") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] == "help" || fields[0] == "completion" {
			continue
		}
		names = append(names, fields[0])
	}
	return names
}

// flagTable renders flags as the Markdown table of configuration.md. The
// help flag is left out: it is not a setting.
func flagTable(flags []helpFlag) string {
	var b strings.Builder
	b.WriteString("| Flag | Type | Default | Description |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, f := range flags {
		if f.Name == "help" {
			continue
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		typ, def := f.Type, f.Default
		if typ == "" {
			typ = "bool"
			if def == "" {
				def = "false"
			}
		}
		if def != "" {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, typ, def, escapeCell(f.Usage))
	}
	return b.String()
}

// escapeCell keeps a usage text literal in a Markdown table cell.
var cellEscaper = strings.NewReplacer(`\`, `\\`, `|`, `\|`, `<`, `\<`, `>`, `\>`, `*`, `\*`, "`", "\\`")

func escapeCell(s string) string { return cellEscaper.Replace(s) }

// replaceBetween replaces what lies between the lines begin and end of doc
// with content, and returns the new document and the old content.
func replaceBetween(doc, begin, end, content string) (string, string, error) {
	i := strings.Index(doc, begin+"\n")
	if i < 0 {
		return "", "", fmt.Errorf("marker %q not found", begin)
	}
	start := i + len(begin) + 1
	// From the newline that ends begin, so that an empty block is found.
	j := strings.Index(doc[i:], "\n"+end+"\n")
	if j < 0 {
		return "", "", fmt.Errorf("marker %q not found after %q", end, begin)
	}
	stop := i + j + 1
	return doc[:start] + content + doc[stop:], doc[start:stop], nil
}
