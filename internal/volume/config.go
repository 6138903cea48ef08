package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"
)

// Plugin types accepted in PluginConfig.Type.
const (
	TypeLocal  = "local"  // built in: a directory per volume under Root, bind-mounted on attach
	TypeBinary = "binary" // an executable forked per hook (CLI flags in, JSON out)
	TypeRPC    = "rpc"    // a long-running gRPC server at SocketPath
)

// DefaultTimeout bounds one hook call when an entry sets no timeout.
const DefaultTimeout = 60 * time.Second

// PluginConfig is one volume_plugins entry. The same entry shape is used on
// the control plane (YAML) and on nodes (TOML); the names must match on both.
type PluginConfig struct {
	Name       string        `yaml:"name" toml:"name"`
	Type       string        `yaml:"type" toml:"type"`
	BinaryPath string        `yaml:"binary_path,omitempty" toml:"binary_path,omitempty"`
	SocketPath string        `yaml:"socket_path,omitempty" toml:"socket_path,omitempty"`
	Timeout    time.Duration `yaml:"timeout,omitempty" toml:"timeout,omitempty"`
	Root       string        `yaml:"root,omitempty" toml:"root,omitempty"`
}

// rawPlugin is what the files hold: timeout is a Go duration string, which
// neither decoder maps onto time.Duration the same way, so it is parsed here.
type rawPlugin struct {
	Name       string `yaml:"name" toml:"name"`
	Type       string `yaml:"type" toml:"type"`
	BinaryPath string `yaml:"binary_path" toml:"binary_path"`
	SocketPath string `yaml:"socket_path" toml:"socket_path"`
	Timeout    string `yaml:"timeout" toml:"timeout"`
	Root       string `yaml:"root" toml:"root"`
}

func (r rawPlugin) config(i int) (PluginConfig, error) {
	c := PluginConfig{Name: r.Name, Type: r.Type, BinaryPath: r.BinaryPath, SocketPath: r.SocketPath, Root: r.Root}
	if r.Timeout != "" {
		d, err := time.ParseDuration(r.Timeout)
		if err != nil {
			return c, fmt.Errorf("%w: volume_plugins[%d] (%q): timeout %q is not a duration such as \"30s\"", ErrConfig, i, r.Name, r.Timeout)
		}
		c.Timeout = d
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c, nil
}

func convert(raws []rawPlugin) ([]PluginConfig, error) {
	out := make([]PluginConfig, 0, len(raws))
	for i, r := range raws {
		c, err := r.config(i)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if err := Validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ParseControllerConfig reads the control plane's plugin list from YAML whose
// top-level volume_plugins key is a list of entries (CubeMaster's conf.yaml
// layout). Other top-level keys are ignored; unknown keys inside an entry
// are errors, so a typo does not silently drop a setting.
func ParseControllerConfig(data []byte) ([]PluginConfig, error) {
	var doc struct {
		VolumePlugins []rawPlugin `yaml:"volume_plugins"`
		// Other components' keys land here, so strict decoding only bites
		// inside the entries.
		Rest map[string]any `yaml:",inline"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if len(doc.VolumePlugins) == 0 {
		return nil, nil
	}
	return convert(doc.VolumePlugins)
}

// NodeConfig is a node's volume plugin configuration.
type NodeConfig struct {
	// BaseDir is volume_plugin_base_dir: every host_path must be inside it.
	BaseDir string
	Plugins []PluginConfig
}

// cubeletStorage is the name of the table CubeSandbox's Cubelet reads.
const cubeletStorage = "io.cubelet.internal.v1.storage"

type storageTable struct {
	BaseDir string      `toml:"volume_plugin_base_dir"`
	Plugins []rawPlugin `toml:"volume_plugins"`
}

// ParseNodeConfig reads a node's plugin configuration from TOML, either in
// Cubelet's layout
//
//	[plugins."io.cubelet.internal.v1.storage"]
//	  volume_plugin_base_dir = "…"
//	[[plugins."io.cubelet.internal.v1.storage".volume_plugins]]
//	  name = "…"
//
// or in Cubicle's own, [storage] with [[storage.volume_plugins]]. Giving both
// is an error (which one wins would be a guess). Other tables are ignored.
func ParseNodeConfig(data []byte) (NodeConfig, error) {
	var doc struct {
		Storage *storageTable             `toml:"storage"`
		Plugins map[string]toml.Primitive `toml:"plugins"`
	}
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return NodeConfig{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	var st *storageTable
	prefix := []string{"storage"}
	if doc.Storage != nil {
		st = doc.Storage
	}
	if prim, ok := doc.Plugins[cubeletStorage]; ok {
		if st != nil {
			return NodeConfig{}, fmt.Errorf("%w: both [storage] and [plugins.%q] are present; keep one", ErrConfig, cubeletStorage)
		}
		st = &storageTable{}
		if err := md.PrimitiveDecode(prim, st); err != nil {
			return NodeConfig{}, fmt.Errorf("%w: [plugins.%q]: %v", ErrConfig, cubeletStorage, err)
		}
		prefix = []string{"plugins", cubeletStorage}
	}
	// Unknown keys inside the plugin entries are typos, not someone else's
	// settings; keys elsewhere are.
	for _, k := range md.Undecoded() {
		if len(k) > len(prefix)+1 && slices.Equal(k[:len(prefix)], prefix) && k[len(prefix)] == "volume_plugins" {
			return NodeConfig{}, fmt.Errorf("%w: unknown key %s", ErrConfig, k.String())
		}
	}
	nc := NodeConfig{BaseDir: DefaultBaseDir}
	if st == nil {
		return nc, nil
	}
	if st.BaseDir != "" {
		if !filepath.IsAbs(st.BaseDir) {
			return NodeConfig{}, fmt.Errorf("%w: volume_plugin_base_dir %q is not an absolute path", ErrConfig, st.BaseDir)
		}
		nc.BaseDir = filepath.Clean(st.BaseDir)
	}
	nc.Plugins, err = convert(st.Plugins)
	if err != nil {
		return NodeConfig{}, err
	}
	return nc, nil
}

// Validate checks a plugin list as loaded by one process. Every error wraps
// ErrConfig and names the offending entry.
func Validate(cfgs []PluginConfig) error {
	var errs []error
	seen := map[string]bool{}
	for i, c := range cfgs {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: volume_plugins[%d] (%q): %s", ErrConfig, i, c.Name, fmt.Sprintf(format, args...)))
		}
		switch {
		case c.Name == "":
			bad("name is required")
		case !nameRE.MatchString(c.Name):
			bad("name must match ^[a-zA-Z0-9_-]+$")
		case seen[c.Name]:
			bad("name is used by an earlier entry; names must be unique")
		}
		seen[c.Name] = true
		if c.Timeout < 0 {
			bad("timeout %s is negative", c.Timeout)
		}
		switch c.Type {
		case TypeLocal:
			if c.BinaryPath != "" || c.SocketPath != "" {
				bad("type local takes root only, not binary_path or socket_path")
			}
			// An empty root means the server's default (<data-dir>/volumes/local).
			if c.Root != "" && !filepath.IsAbs(c.Root) {
				bad("root %q is not an absolute path", c.Root)
			}
		case TypeBinary:
			if c.SocketPath != "" || c.Root != "" {
				bad("type binary takes binary_path only, not socket_path or root")
			}
			if err := checkExecutable(c.BinaryPath); err != nil {
				bad("%v", err)
			}
		case TypeRPC:
			if c.BinaryPath != "" || c.Root != "" {
				bad("type rpc takes socket_path only, not binary_path or root")
			}
			if c.SocketPath == "" {
				bad("type rpc needs socket_path")
			} else if _, _, err := ParseSocketPath(c.SocketPath); err != nil {
				bad("%v", err)
			}
		case "":
			bad("type is required (local, binary or rpc)")
		default:
			bad("unknown type %q (want local, binary or rpc)", c.Type)
		}
	}
	return errors.Join(errs...)
}

func checkExecutable(path string) error {
	if path == "" {
		return errors.New("type binary needs binary_path")
	}
	// Absolute only: the daemon's working directory is arbitrary and a bare
	// name would be looked up in $PATH.
	if !filepath.IsAbs(path) {
		return fmt.Errorf("binary_path %q is not an absolute path", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("binary_path: %v", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("binary_path %q is not an executable file", path)
	}
	return nil
}

// ParseSocketPath maps an rpc plugin's socket_path to a dialable network and
// address: a bare path ("/run/x.sock") or unix:///path is a Unix socket,
// anything else must be TCP host:port.
func ParseSocketPath(s string) (network, address string, err error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		p := strings.TrimPrefix(s, "unix://")
		if !filepath.IsAbs(p) {
			return "", "", fmt.Errorf("socket_path %q: want unix:///absolute/path", s)
		}
		return "unix", p, nil
	case strings.HasPrefix(s, "unix:"):
		p := strings.TrimPrefix(s, "unix:")
		if p == "" {
			return "", "", fmt.Errorf("socket_path %q has no path", s)
		}
		return "unix", p, nil
	case strings.HasPrefix(s, "/"), strings.HasPrefix(s, "./"), strings.HasPrefix(s, "../"):
		return "unix", s, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return "", "", fmt.Errorf("socket_path %q is neither a Unix socket path nor TCP host:port", s)
	}
	_ = host // empty host means all local addresses when listening, localhost when dialing
	return "tcp", s, nil
}

// CheckAligned verifies that the control plane and a node register the same
// driver names; a volume created through a driver the node lacks could never
// be mounted, and the reverse is dead configuration.
func CheckAligned(controller, node []PluginConfig) error {
	names := func(cs []PluginConfig) map[string]bool {
		m := map[string]bool{}
		for _, c := range cs {
			m[c.Name] = true
		}
		return m
	}
	cn, nn := names(controller), names(node)
	var onlyC, onlyN []string
	for _, c := range controller {
		if !nn[c.Name] && !slices.Contains(onlyC, c.Name) {
			onlyC = append(onlyC, c.Name)
		}
	}
	for _, c := range node {
		if !cn[c.Name] && !slices.Contains(onlyN, c.Name) {
			onlyN = append(onlyN, c.Name)
		}
	}
	if len(onlyC) == 0 && len(onlyN) == 0 {
		return nil
	}
	var parts []string
	if len(onlyC) > 0 {
		parts = append(parts, "missing on the node: "+strings.Join(onlyC, ", "))
	}
	if len(onlyN) > 0 {
		parts = append(parts, "missing on the control plane: "+strings.Join(onlyN, ", "))
	}
	return fmt.Errorf("%w: control plane and node volume_plugins differ: %s", ErrConfig, strings.Join(parts, "; "))
}
