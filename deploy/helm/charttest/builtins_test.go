package charttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// renderWith renders the default values with over coalesced on top.
func renderWith(t *testing.T, over map[string]any) objects {
	t.Helper()
	files, err := render(t, loadChart(t), chartutil.CoalesceTables(over, readValues(t, "default")))
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	o := decodeStrict(t, files)
	checkReferences(t, o)
	return o
}

func controlPlane(t *testing.T, o objects) *appsv1.Deployment {
	t.Helper()
	d := o.deployments["cubicle"]
	if d == nil {
		t.Fatalf("no Deployment cubicle; have %v", keys(o.deployments))
	}
	return d
}

func mountOf(c corev1.Container, volume string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == volume {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volumeOf(p corev1.PodSpec, name string) *corev1.Volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// The default control plane copies the built-ins from the builtins image
// into an emptyDir that serve uses as its images dir and publishes from.
func TestBuiltinsInitContainer(t *testing.T) {
	d := controlPlane(t, renderCase(t, "default"))
	p := d.Spec.Template.Spec
	init := container(t, p.InitContainers, "builtins")
	if init.Image != "ghcr.io/cubicle-dev/cubicle-builtins:0.1.0" {
		t.Errorf("init image %q, want ghcr.io/cubicle-dev/cubicle-builtins:<appVersion>", init.Image)
	}
	if init.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("init pull policy %q", init.ImagePullPolicy)
	}
	if len(init.Command) != 3 || init.Command[0] != "/bin/sh" || !strings.Contains(init.Command[2], "/images/*") {
		t.Errorf("init command %q does not copy /images/*", init.Command)
	}
	if envValue(init.Env, "IMAGES_DIR") != "/var/lib/cubicle-images" {
		t.Errorf("init IMAGES_DIR %q", envValue(init.Env, "IMAGES_DIR"))
	}
	if m := mountOf(init, "images"); m == nil || m.MountPath != "/var/lib/cubicle-images" || m.ReadOnly {
		t.Errorf("init mounts images at %+v, want /var/lib/cubicle-images read-write", m)
	}
	sc := init.SecurityContext
	if sc == nil || sc.Privileged != nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETFCAP"}) {
		t.Errorf("init security context %+v: want ALL dropped, only CHOWN DAC_OVERRIDE FOWNER FSETID SETFCAP added", sc)
	}

	c := container(t, p.Containers, "cubicle")
	for _, want := range []string{"--images-dir=/var/lib/cubicle-images", "--publish-builtins"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("serve args %q lack %q", c.Args, want)
		}
	}
	if m := mountOf(c, "images"); m == nil || m.MountPath != "/var/lib/cubicle-images" {
		t.Errorf("serve mounts images at %+v, want /var/lib/cubicle-images", m)
	}
	if caps := c.SecurityContext.Capabilities; caps == nil || !slices.Equal(caps.Add, []corev1.Capability{"DAC_READ_SEARCH"}) {
		t.Errorf("serve capabilities %+v, want only DAC_READ_SEARCH added (publishing reads other users' files)", caps)
	}
	v := volumeOf(p, "images")
	if v == nil || v.EmptyDir == nil || v.EmptyDir.SizeLimit != nil {
		t.Errorf("images volume %+v, want an emptyDir without a limit", v)
	}
}

func TestBuiltinsValues(t *testing.T) {
	t.Run("image and size limit", func(t *testing.T) {
		o := renderWith(t, map[string]any{
			"builtins":     map[string]any{"image": map[string]any{"repository": "registry.example.org/cubicle-builtins", "tag": "v9", "pullPolicy": "Always"}},
			"controlPlane": map[string]any{"imagesVolume": map[string]any{"sizeLimit": "20Gi"}},
		})
		p := controlPlane(t, o).Spec.Template.Spec
		init := container(t, p.InitContainers, "builtins")
		if init.Image != "registry.example.org/cubicle-builtins:v9" || init.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("init image %q %q, want registry.example.org/cubicle-builtins:v9 Always", init.Image, init.ImagePullPolicy)
		}
		v := volumeOf(p, "images")
		if v == nil || v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || !v.EmptyDir.SizeLimit.Equal(resource.MustParse("20Gi")) {
			t.Errorf("images volume %+v, want an emptyDir limited to 20Gi", v)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		o := renderWith(t, map[string]any{"builtins": map[string]any{"enabled": false}})
		p := controlPlane(t, o).Spec.Template.Spec
		if len(p.InitContainers) != 0 {
			t.Errorf("builtins disabled, init containers %v", p.InitContainers)
		}
		if volumeOf(p, "images") != nil {
			t.Error("builtins disabled, images volume rendered")
		}
		c := container(t, p.Containers, "cubicle")
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--images-dir") || a == "--publish-builtins" {
				t.Errorf("builtins disabled, serve gets %s", a)
			}
		}
		if c.SecurityContext.Capabilities.Add != nil {
			t.Errorf("builtins disabled, serve gets capabilities %v", c.SecurityContext.Capabilities.Add)
		}
	})
}

// TestBuiltinsScript runs the init container's script with the host's sh
// over a stand-in /images: it copies each image whole, keeping modes, and
// a rerun (the container restarted in the same pod) replaces the copies.
func TestBuiltinsScript(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	init := container(t, controlPlane(t, renderCase(t, "default")).Spec.Template.Spec.InitContainers, "builtins")
	src, dst := t.TempDir(), t.TempDir()
	script := strings.ReplaceAll(init.Command[2], "/images/*", src+"/*")
	for _, n := range []string{"base", "mini"} {
		if err := os.MkdirAll(filepath.Join(src, n, "rootfs", "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, n, ".recipe-sha256"), []byte(n+"-recipe\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sh := filepath.Join(src, n, "rootfs", "bin", "sh")
		if err := os.WriteFile(sh, []byte("#!"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sh, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	}
	for run := range 2 {
		if run == 1 { // a stale partial copy from an interrupted run
			if err := os.MkdirAll(filepath.Join(dst, "mini.tmp", "junk"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(sh, "-ec", script)
		cmd.Env = []string{"IMAGES_DIR=" + dst, "PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
		if !strings.Contains(string(out), "built-in image mini: mini-recipe") {
			t.Errorf("run %d printed %q", run, out)
		}
		entries, err := os.ReadDir(dst)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"base", "mini"}) {
			t.Errorf("run %d: images dir holds %v, want [base mini]", run, names)
		}
		fi, err := os.Stat(filepath.Join(dst, "mini", "rootfs", "bin", "sh"))
		if err != nil {
			t.Fatal(err)
		}
		if want := os.FileMode(0o755) | os.ModeSetuid; fi.Mode() != want {
			t.Errorf("run %d: copied sh mode %v, want %v", run, fi.Mode(), want)
		}
	}
}
