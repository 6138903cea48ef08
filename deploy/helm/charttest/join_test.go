package charttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestJoinScript runs the node pod's join init container as rendered, with
// sh and a stand-in `cubicle` on PATH that records its arguments and the
// token it was given: a joined machine does not join again, a machine
// without a token fails naming its key, and one with a token joins with
// the token kept out of the arguments.
func TestJoinScript(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh: %v", err)
	}
	o := renderCase(t, "runsc-gpu")
	join := container(t, o.daemonSets["cubicle-node"].Spec.Template.Spec.InitContainers, "join")
	if len(join.Command) != 3 || join.Command[0] != "sh" {
		t.Fatalf("join command %q, want sh -ec SCRIPT", join.Command)
	}
	for _, m := range join.VolumeMounts {
		if m.Name == "join" && m.MountPath != envValue(join.Env, "JOIN_DIR") {
			t.Fatalf("tokens mounted at %s, script reads %s", m.MountPath, envValue(join.Env, "JOIN_DIR"))
		}
	}

	run := func(t *testing.T, nodeName string, joined bool, tokens map[string]string) (out string, args []string, token string, err error) {
		dir := t.TempDir()
		bin, data, tokDir := filepath.Join(dir, "bin"), filepath.Join(dir, "data"), filepath.Join(dir, "join")
		for _, d := range []string{bin, data, tokDir} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if joined {
			if err := os.WriteFile(filepath.Join(data, "node.crt"), []byte("cert"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for n, tok := range tokens {
			if err := os.WriteFile(filepath.Join(tokDir, n), []byte(tok), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		rec := filepath.Join(dir, "rec")
		stub := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + rec + ".args\nprintf %s \"$CUBICLE_JOIN_TOKEN\" > " + rec + ".token\n"
		if err := os.WriteFile(filepath.Join(bin, "cubicle"), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sh, join.Command[1:]...)
		env := map[string]string{"NODE_NAME": nodeName, "HOST_IP": "10.0.0.7", "DATA_DIR": data, "JOIN_DIR": tokDir}
		for _, e := range join.Env {
			if _, set := env[e.Name]; !set && e.ValueFrom == nil {
				env[e.Name] = e.Value
			}
		}
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		b, err := cmd.CombinedOutput()
		a, _ := os.ReadFile(rec + ".args")
		tk, _ := os.ReadFile(rec + ".token")
		if len(a) > 0 {
			args = strings.Split(strings.TrimSuffix(string(a), "\n"), "\n")
		}
		return string(b), args, string(tk), err
	}

	t.Run("joined already", func(t *testing.T) {
		out, args, _, err := run(t, "gpu-2", true, map[string]string{"gpu-2": "abcdef012345.ffeeddccbbaa99887766554433221100"})
		if err != nil || args != nil {
			t.Fatalf("err %v, cubicle called with %q; output %s", err, args, out)
		}
	})
	t.Run("no token for this machine", func(t *testing.T) {
		out, args, _, err := run(t, "gpu-3", false, map[string]string{"gpu-2": "abcdef012345.ffeeddccbbaa99887766554433221100"})
		if err == nil || args != nil {
			t.Fatalf("err %v, cubicle called with %q", err, args)
		}
		if !strings.Contains(out, "gpu-3") || !strings.Contains(out, "cubicle-join") {
			t.Errorf("output %q does not name the node and the Secret", out)
		}
	})
	t.Run("joins", func(t *testing.T) {
		const tok = "0123456789ab.00112233445566778899aabbccddeeff"
		out, args, token, err := run(t, "gpu-1.example.com", false, map[string]string{"gpu-1.example.com": tok})
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		want := []string{"node", "join", "--control-plane", "https://cubicle.sandbox.svc:443",
			"--ca-pin", "sha256:0f3c2a9d8e7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877",
			"--node-id", "gpu-1-example-com", "--data-dir", "", "--address", "10.0.0.7"}
		if len(args) != len(want) {
			t.Fatalf("cubicle %q, want %q", args, want)
		}
		for i := range want {
			if want[i] != "" && args[i] != want[i] {
				t.Errorf("argument %d: %q, want %q (all: %q)", i, args[i], want[i], args)
			}
		}
		if token != tok {
			t.Errorf("CUBICLE_JOIN_TOKEN %q, want the machine's token", token)
		}
		if strings.Contains(strings.Join(args, " "), tok) {
			t.Error("the token is in cubicle's arguments (visible in ps)")
		}
	})
}
