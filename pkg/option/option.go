// SPDX-License-Identifier: Apache-2.0

// Package option reads the agent's configuration from the places an operator
// puts it besides flags: a Cilium-style --config-dir (one file per key, as a
// Kubernetes ConfigMap is mounted) and a YAML --config-file that accepts the
// CFP's `xds-control-plane:` block verbatim. Flags given on the command line
// win over both; the config file wins over the config dir.
package option

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// XDSBlock is the nested block of the CFP. Its keys map onto flags:
// `enabled` → --enable-xds-control-plane, any other key K → --xds-K.
const XDSBlock = "xds-control-plane"

// Load reads dir and file (either may be empty) and returns the settings
// keyed by flag name. Every key must name a flag of flags: a typo is an
// error naming the key and where it was found.
func Load(flags *pflag.FlagSet, dir, file string) (map[string]any, error) {
	settings := map[string]any{}
	if dir != "" {
		if err := loadDir(flags, dir, settings); err != nil {
			return nil, err
		}
	}
	if file != "" {
		if err := loadFile(flags, file, settings); err != nil {
			return nil, err
		}
	}
	return settings, nil
}

func loadDir(flags *pflag.FlagSet, dir string, settings map[string]any) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("--config-dir: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		// ConfigMap mounts keep their data behind "..data" links.
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--config-dir: %w", err)
		}
		if err := set(flags, settings, name, strings.TrimSpace(string(data)), path); err != nil {
			return err
		}
	}
	return nil
}

func loadFile(flags *pflag.FlagSet, file string, settings map[string]any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("--config-file: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("--config-file %s: %w", file, err)
	}
	for _, key := range slices.Sorted(maps.Keys(doc)) {
		val := doc[key]
		if key != XDSBlock {
			if err := set(flags, settings, key, val, file); err != nil {
				return err
			}
			continue
		}
		block, ok := val.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %s: want a mapping of settings, got %T", file, XDSBlock, val)
		}
		for _, k := range slices.Sorted(maps.Keys(block)) {
			flag := "xds-" + k
			if k == "enabled" {
				flag = "enable-xds-control-plane"
			}
			if err := set(flags, settings, flag, block[k], file+": "+XDSBlock+"."+k); err != nil {
				return err
			}
		}
	}
	return nil
}

// set checks that key is a flag; its value is parsed and checked by the
// hive with the rest of the configuration.
func set(flags *pflag.FlagSet, settings map[string]any, key string, val any, where string) error {
	if flags.Lookup(key) == nil {
		return fmt.Errorf("%s: %q is not a setting of the agent (see l4xds-agent --help)", where, key)
	}
	settings[key] = toString(val)
	return nil
}

func toString(val any) string {
	switch v := val.(type) {
	case nil:
		return ""
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = fmt.Sprint(x)
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(val)
}
