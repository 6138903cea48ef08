package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a`:             `/a`,
		`/with\040space`: `/with space`,
		`/tab\011x`:      "/tab\tx",
		`/back\134slash`: `/back\slash`,
		`/trailing\04`:   `/trailing\04`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestIsMountpoint(t *testing.T) {
	if ok, err := IsMountpoint("/proc"); err != nil || !ok {
		t.Errorf("/proc: %v %v", ok, err)
	}
	dir := t.TempDir()
	if ok, err := IsMountpoint(dir); err != nil || ok {
		t.Errorf("%s: %v %v", dir, ok, err)
	}
	if ok, err := IsMountpoint(dir + "/missing"); err != nil || ok {
		t.Errorf("missing: %v %v", ok, err)
	}
	if mps, err := Under(dir); err != nil || len(mps) != 0 {
		t.Errorf("Under: %v %v", mps, err)
	}
}
