package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// exe makes an executable file for binary_path validation.
func exe(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseControllerConfigSeed(t *testing.T) {
	bin := exe(t)
	// CubeMaster's conf.yaml layout, with other components' keys around it.
	data := `
log:
  level: info
volume_plugins:
  - name: cos
    type: binary
    binary_path: ` + bin + `

  - name: juicefs
    type: rpc
    socket_path: /run/juicefs.sock   # bare Unix path; plugin SOCKET must match
    timeout: 30s
  - name: local
    type: local
    root: /var/lib/cubicle/volumes
server:
  port: 8089
`
	got, err := ParseControllerConfig([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := []PluginConfig{
		{Name: "cos", Type: "binary", BinaryPath: bin, Timeout: DefaultTimeout},
		{Name: "juicefs", Type: "rpc", SocketPath: "/run/juicefs.sock", Timeout: 30 * time.Second},
		{Name: "local", Type: "local", Root: "/var/lib/cubicle/volumes", Timeout: DefaultTimeout},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries: %+v", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestParseControllerConfigEmpty(t *testing.T) {
	for _, data := range []string{"", "server: {port: 1}\n", "volume_plugins:\n", "volume_plugins: []\n"} {
		got, err := ParseControllerConfig([]byte(data))
		if err != nil || len(got) != 0 {
			t.Errorf("%q: got %v, %v", data, got, err)
		}
	}
}

func TestParseControllerConfigErrors(t *testing.T) {
	for name, data := range map[string]string{
		"bad yaml":       "volume_plugins: [",
		"not a list":     "volume_plugins: {name: x}",
		"unknown field":  "volume_plugins:\n  - name: a\n    type: rpc\n    socket_path: /run/a.sock\n    socket: /run/a.sock\n",
		"bad timeout":    "volume_plugins:\n  - name: a\n    type: rpc\n    socket_path: /run/a.sock\n    timeout: soon\n",
		"number timeout": "volume_plugins:\n  - name: a\n    type: rpc\n    socket_path: /run/a.sock\n    timeout: 30\n",
		"invalid entry":  "volume_plugins:\n  - name: a\n    type: ftp\n",
	} {
		if _, err := ParseControllerConfig([]byte(data)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
}

func TestParseNodeConfigCubeletSpelling(t *testing.T) {
	bin := exe(t)
	// Cubelet's config.toml layout, with an unrelated plugin table.
	data := `
version = 2
[plugins."io.cubelet.internal.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.cubelet.internal.v1.storage"]
  volume_plugin_base_dir = "/data/cube-shared/volume2"

[[plugins."io.cubelet.internal.v1.storage".volume_plugins]]
  name        = "cos"
  type        = "binary"       # binary | rpc
  binary_path = "` + bin + `"

[[plugins."io.cubelet.internal.v1.storage".volume_plugins]]
  name        = "juicefs"
  type        = "rpc"
  socket_path = "/run/juicefs.sock"   # same path as plugin SOCKET
  timeout     = "2m"
`
	nc, err := ParseNodeConfig([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if nc.BaseDir != "/data/cube-shared/volume2" {
		t.Errorf("base dir %q", nc.BaseDir)
	}
	want := []PluginConfig{
		{Name: "cos", Type: "binary", BinaryPath: bin, Timeout: DefaultTimeout},
		{Name: "juicefs", Type: "rpc", SocketPath: "/run/juicefs.sock", Timeout: 2 * time.Minute},
	}
	if len(nc.Plugins) != 2 || nc.Plugins[0] != want[0] || nc.Plugins[1] != want[1] {
		t.Errorf("plugins %+v", nc.Plugins)
	}
}

func TestParseNodeConfigCubicleSpelling(t *testing.T) {
	data := `
[storage]
[[storage.volume_plugins]]
  name = "local"
  type = "local"
  root = "/var/lib/cubicle/volumes"
[[storage.volume_plugins]]
  name = "tcp-plugin"
  type = "rpc"
  socket_path = "127.0.0.1:7000"
`
	nc, err := ParseNodeConfig([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if nc.BaseDir != DefaultBaseDir {
		t.Errorf("base dir %q, want default", nc.BaseDir)
	}
	if len(nc.Plugins) != 2 || nc.Plugins[0].Root != "/var/lib/cubicle/volumes" || nc.Plugins[1].SocketPath != "127.0.0.1:7000" {
		t.Errorf("plugins %+v", nc.Plugins)
	}
}

func TestParseNodeConfigNone(t *testing.T) {
	nc, err := ParseNodeConfig([]byte("[other]\nx = 1\n"))
	if err != nil || nc.BaseDir != DefaultBaseDir || len(nc.Plugins) != 0 {
		t.Errorf("got %+v, %v", nc, err)
	}
}

func TestParseNodeConfigErrors(t *testing.T) {
	for name, data := range map[string]string{
		"both spellings": "[storage]\nvolume_plugin_base_dir = \"/a\"\n[plugins.\"io.cubelet.internal.v1.storage\"]\nvolume_plugin_base_dir = \"/b\"\n",
		"bad toml":       "[storage\n",
		"relative base":  "[storage]\nvolume_plugin_base_dir = \"data\"\n",
		"unknown key":    "[[storage.volume_plugins]]\nname = \"a\"\ntype = \"rpc\"\nsocket_path = \"/run/a.sock\"\nsocket = \"/run/a.sock\"\n",
		"bad timeout":    "[[storage.volume_plugins]]\nname = \"a\"\ntype = \"rpc\"\nsocket_path = \"/run/a.sock\"\ntimeout = \"x\"\n",
		"invalid entry":  "[[storage.volume_plugins]]\nname = \"a\"\n",
		"duplicate":      "[[storage.volume_plugins]]\nname = \"a\"\ntype = \"rpc\"\nsocket_path = \"/run/a.sock\"\n[[storage.volume_plugins]]\nname = \"a\"\ntype = \"rpc\"\nsocket_path = \"/run/b.sock\"\n",
	} {
		if _, err := ParseNodeConfig([]byte(data)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	bin := exe(t)
	notExec := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := []PluginConfig{
		{Name: "a-1_B", Type: "binary", BinaryPath: bin},
		{Name: "r", Type: "rpc", SocketPath: "unix:///run/r.sock"},
		{Name: "t", Type: "rpc", SocketPath: "localhost:9000"},
		{Name: "l", Type: "local", Root: "/srv/v", Timeout: time.Second},
	}
	if err := Validate(ok); err != nil {
		t.Fatalf("valid list rejected: %v", err)
	}
	bad := map[string]PluginConfig{
		"empty name":         {Type: "rpc", SocketPath: "/run/x.sock"},
		"bad name":           {Name: "a/b", Type: "rpc", SocketPath: "/run/x.sock"},
		"name with dot":      {Name: "a.b", Type: "rpc", SocketPath: "/run/x.sock"},
		"no type":            {Name: "x"},
		"unknown type":       {Name: "x", Type: "nfs"},
		"binary no path":     {Name: "x", Type: "binary"},
		"binary relative":    {Name: "x", Type: "binary", BinaryPath: "plugin"},
		"binary missing":     {Name: "x", Type: "binary", BinaryPath: "/nonexistent/plugin"},
		"binary not exec":    {Name: "x", Type: "binary", BinaryPath: notExec},
		"binary is dir":      {Name: "x", Type: "binary", BinaryPath: t.TempDir()},
		"binary with socket": {Name: "x", Type: "binary", BinaryPath: bin, SocketPath: "/run/x.sock"},
		"rpc no socket":      {Name: "x", Type: "rpc"},
		"rpc bad socket":     {Name: "x", Type: "rpc", SocketPath: "run-x.sock"},
		"rpc with binary":    {Name: "x", Type: "rpc", SocketPath: "/run/x.sock", BinaryPath: bin},
		"local with binary":  {Name: "x", Type: "local", Root: "/srv", BinaryPath: bin},
		"local with socket":  {Name: "x", Type: "local", Root: "/srv", SocketPath: "/run/x.sock"},
		"local rel root":     {Name: "x", Type: "local", Root: "srv"},
		"negative timeout":   {Name: "x", Type: "rpc", SocketPath: "/run/x.sock", Timeout: -time.Second},
	}
	for name, c := range bad {
		if err := Validate([]PluginConfig{c}); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", name, err)
		}
	}
	dup := []PluginConfig{ok[1], {Name: "r", Type: "rpc", SocketPath: "/run/other.sock"}}
	if err := Validate(dup); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "unique") {
		t.Errorf("duplicate: %v", err)
	}
}

func TestParseSocketPath(t *testing.T) {
	for in, want := range map[string][2]string{
		"/run/x.sock":        {"unix", "/run/x.sock"},
		"unix:///run/x.sock": {"unix", "/run/x.sock"},
		"unix:rel.sock":      {"unix", "rel.sock"},
		"127.0.0.1:7000":     {"tcp", "127.0.0.1:7000"},
		"[::1]:7000":         {"tcp", "[::1]:7000"},
		"plugin.local:80":    {"tcp", "plugin.local:80"},
	} {
		n, a, err := ParseSocketPath(in)
		if err != nil || n != want[0] || a != want[1] {
			t.Errorf("%q: got %s %s %v", in, n, a, err)
		}
	}
	for _, in := range []string{"", "x.sock", "unix://rel", "host:"} {
		if _, _, err := ParseSocketPath(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestCheckAligned(t *testing.T) {
	c := []PluginConfig{{Name: "cos"}, {Name: "local"}, {Name: "nfs"}}
	n := []PluginConfig{{Name: "local"}, {Name: "cos"}, {Name: "juicefs"}}
	err := CheckAligned(c, n)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "missing on the node: nfs") || !strings.Contains(err.Error(), "missing on the control plane: juicefs") {
		t.Errorf("message does not name both sides: %v", err)
	}
	if err := CheckAligned(c[:2], n[:2]); err != nil {
		t.Errorf("same names in another order: %v", err)
	}
	if err := CheckAligned(nil, nil); err != nil {
		t.Error(err)
	}
}
