package recipe

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const (
	hashA = "5d9e391ef8265bdbf5dab1e924668ade1282d8450786c7b0ae91d5dd5405e8c8"
	hashB = "3883a9605d900d6c2e8844fb119d9d39c36c6cb9f8debaa0f75b63b6199438b9"
	bid   = "bld_1c2d"
)

func all(string) bool { return true }

func render(t *testing.T, steps ...Step) *Result {
	t.Helper()
	res, err := Render(BuildStart{FromImage: "python:3.13", Steps: steps}, "python:3.13", bid, all)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return res
}

// body is the Dockerfile without its FROM line.
func body(res *Result) string {
	_, rest, _ := strings.Cut(string(res.Dockerfile), "\n")
	return rest
}

func renderErr(t *testing.T, steps ...Step) *Error {
	t.Helper()
	_, err := Render(BuildStart{FromImage: "python:3.13", Steps: steps}, "python:3.13", bid, all)
	if err == nil {
		t.Fatalf("Render succeeded, want error")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %v does not wrap ErrInvalid", err)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %T is not *Error", err)
	}
	return e
}

func ptr(v int64) *int64 { return &v }

// The translation example in CEP "BuildKit translation".
func TestCEPTranslationExample(t *testing.T) {
	req := BuildStart{
		FromImage: "python:3.13",
		Steps: []Step{
			{Type: "COPY", Args: []string{"requirements.txt", "/home/user/requirements.txt", "", ""}, FilesHash: hashA},
			{Type: "RUN", Args: []string{"pip install -r /home/user/requirements.txt"}},
		},
	}
	res, err := Render(req, "python:3.13", bid, all)
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM python:3.13\n" +
		"COPY " + hashA + "/requirements.txt /home/user/requirements.txt\n" +
		"RUN pip install -r /home/user/requirements.txt\n"
	if string(res.Dockerfile) != want {
		t.Fatalf("Dockerfile:\n%s\nwant:\n%s", res.Dockerfile, want)
	}
	if !reflect.DeepEqual(res.Hashes, []string{hashA}) {
		t.Fatalf("Hashes = %v", res.Hashes)
	}
	if res.RunAsUser != nil || res.RunAsGroup != nil || res.RunAsUsername != "" || res.User != "" {
		t.Fatalf("user set without a USER step: %+v", res)
	}
	if res.NoCache {
		t.Fatal("NoCache without force")
	}
}

// The request body the e2b JS SDK 2.51 sent (protocol doc 5.4), decoded
// from JSON so unknown step keys are exercised too.
func TestSDKObservedRequest(t *testing.T) {
	raw := `{"startCmd":"python main.py","readyCmd":"sleep 1","steps":[
	 {"type":"COPY","args":["app","/app","",""],"force":false,"filesHash":"` + hashA + `","forceUpload":true,"resolveSymlinks":false,"gzip":true},
	 {"type":"COPY","args":["req.txt","/app/req.txt","",""],"force":false,"filesHash":"` + hashB + `"},
	 {"type":"RUN","args":["pip install -r /app/req.txt"],"force":false},
	 {"type":"ENV","args":["FOO","bar"],"force":false},
	 {"type":"WORKDIR","args":["/app"],"force":false}],"force":false,"fromImage":"python:3.12"}`
	var req BuildStart
	if err := json.Unmarshal([]byte(raw), &req); err != nil {
		t.Fatal(err)
	}
	if req.StartCmd != "python main.py" || req.ReadyCmd != "sleep 1" || len(req.Steps) != 5 {
		t.Fatalf("decoded %+v", req)
	}
	var asked []string
	res, err := Render(req, req.FromImage, bid, func(h string) bool { asked = append(asked, h); return true })
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM python:3.12\n" +
		"COPY " + hashA + "/app /app\n" +
		"COPY " + hashB + "/req.txt /app/req.txt\n" +
		"RUN pip install -r /app/req.txt\n" +
		"WORKDIR /app\n"
	if string(res.Dockerfile) != want {
		t.Fatalf("Dockerfile:\n%s\nwant:\n%s", res.Dockerfile, want)
	}
	if !reflect.DeepEqual(res.Hashes, []string{hashA, hashB}) || !reflect.DeepEqual(asked, []string{hashA, hashB}) {
		t.Fatalf("Hashes = %v, asked %v", res.Hashes, asked)
	}
	if res.Workdir != "/app" {
		t.Fatalf("Workdir = %q", res.Workdir)
	}
	wantLines := map[int]int{2: 0, 3: 1, 4: 2, 5: 4}
	if !reflect.DeepEqual(res.StepOfLine, wantLines) {
		t.Fatalf("StepOfLine = %v, want %v", res.StepOfLine, wantLines)
	}
}

// The TemplateBuildStartV2 example in CEP "API / CRD / Wire Changes".
func TestCEPRequestExample(t *testing.T) {
	raw := `{"fromImage":"python:3.13","fromTemplate":"",
	 "fromImageRegistry":{"type":"registry","username":"ci","password":"secret"},
	 "force":false,"startCmd":"python -m http.server 8080","readyCmd":"curl -sf http://127.0.0.1:8080/",
	 "steps":[{"type":"USER","args":["1000"]},
	  {"type":"COPY","args":["requirements.txt","/home/user/requirements.txt"],"filesHash":"` + hashA + `"},
	  {"type":"RUN","args":["pip install -r /home/user/requirements.txt"]}]}`
	var req BuildStart
	if err := json.Unmarshal([]byte(raw), &req); err != nil {
		t.Fatal(err)
	}
	if req.FromImageRegistry == nil || req.FromImageRegistry.Type != "registry" || req.FromImageRegistry.Password != "secret" {
		t.Fatalf("registry = %+v", req.FromImageRegistry)
	}
	res, err := Render(req, req.FromImage, bid, all)
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM python:3.13\n" +
		"USER 1000\n" +
		"COPY " + hashA + "/requirements.txt /home/user/requirements.txt\n" +
		"RUN pip install -r /home/user/requirements.txt\n"
	if string(res.Dockerfile) != want {
		t.Fatalf("Dockerfile:\n%s\nwant:\n%s", res.Dockerfile, want)
	}
	if res.RunAsUser == nil || *res.RunAsUser != 1000 || res.RunAsGroup != nil || res.User != "1000" {
		t.Fatalf("user: %+v", res)
	}
	if strings.Contains(string(res.Dockerfile), "secret") {
		t.Fatal("registry password leaked into the Dockerfile")
	}
}

func TestRegistryJSON(t *testing.T) {
	for _, raw := range []string{
		`{"type":"aws","awsAccessKeyId":"AK","awsSecretAccessKey":"SK","awsRegion":"us-east-1"}`,
		`{"type":"gcp","serviceAccountJson":"{}"}`,
	} {
		var r Registry
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		out, _ := json.Marshal(r)
		var back, orig map[string]any
		_ = json.Unmarshal(out, &back)
		_ = json.Unmarshal([]byte(raw), &orig)
		if !reflect.DeepEqual(back, orig) {
			t.Fatalf("round trip %s -> %s", raw, out)
		}
	}
}

func TestFromImageXorFromTemplate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     BuildStart
		wantErr bool
	}{
		{"image", BuildStart{FromImage: "busybox"}, false},
		{"template", BuildStart{FromTemplate: "tpl_1"}, false},
		{"both", BuildStart{FromImage: "busybox", FromTemplate: "tpl_1"}, true},
		{"neither", BuildStart{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Render(tc.req, "registry.local/x:1", bid, all)
			if tc.wantErr {
				var e *Error
				if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Step != -1 {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil || string(res.Dockerfile) != "FROM registry.local/x:1\n" {
				t.Fatalf("res %v err %v", res, err)
			}
		})
	}
}

func TestBadBase(t *testing.T) {
	for _, base := range []string{"", "a b", "busybox\nRUN x"} {
		if _, err := Render(BuildStart{FromImage: "x"}, base, bid, all); !errors.Is(err, ErrInvalid) {
			t.Errorf("base %q: err = %v", base, err)
		}
	}
}

func TestStepTypes(t *testing.T) {
	for _, tc := range []struct {
		typ    string
		reason string
	}{
		{"ARG", "ARG steps are not supported"},
		{"EXPOSE", `unknown step type "EXPOSE"`},
		{"FROM", `unknown step type "FROM"`},
		{"", "step type is empty"},
	} {
		e := renderErr(t, Step{Type: "RUN", Args: []string{"true"}}, Step{Type: tc.typ, Args: []string{"X=1"}})
		if e.Step != 1 || e.Reason != tc.reason {
			t.Errorf("%q: got step %d %q", tc.typ, e.Step, e.Reason)
		}
	}
}

func TestENV(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []Step
		want  string
	}{
		{
			"simple",
			[]Step{{Type: "ENV", Args: []string{"FOO", "bar"}}, {Type: "RUN", Args: []string{"echo $FOO"}}},
			"RUN export FOO='bar'; echo $FOO\n",
		},
		{
			"spaces and compound command",
			[]Step{{Type: "ENV", Args: []string{"MSG", "hello world"}}, {Type: "RUN", Args: []string{"a && b"}}},
			"RUN export MSG='hello world'; a && b\n",
		},
		{
			"quotes and dollar stay literal",
			[]Step{{Type: "ENV", Args: []string{"Q", `it's "$HOME" \n`}}, {Type: "RUN", Args: []string{"x"}}},
			`RUN export Q='it'\''s "$HOME" \n'; x` + "\n",
		},
		{
			"empty value",
			[]Step{{Type: "ENV", Args: []string{"E", ""}}, {Type: "RUN", Args: []string{"x"}}},
			"RUN export E=''; x\n",
		},
		{
			"later keys override, first position kept",
			[]Step{
				{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
				{Type: "RUN", Args: []string{"one"}},
				{Type: "ENV", Args: []string{"A", "3", "C", "4"}},
				{Type: "RUN", Args: []string{"two"}},
			},
			"RUN export A='1'; export B='2'; one\n" +
				"RUN export A='3'; export B='2'; export C='4'; two\n",
		},
		{
			"override within one step",
			[]Step{{Type: "ENV", Args: []string{"A", "1", "A", "2"}}, {Type: "RUN", Args: []string{"x"}}},
			"RUN export A='2'; x\n",
		},
		{
			"only later RUNs",
			[]Step{{Type: "RUN", Args: []string{"before"}}, {Type: "ENV", Args: []string{"A", "1"}}, {Type: "RUN", Args: []string{"after"}}},
			"RUN before\nRUN export A='1'; after\n",
		},
		{
			"newline in value switches to exec form",
			[]Step{{Type: "ENV", Args: []string{"A", "l1\nl2"}}, {Type: "RUN", Args: []string{"x"}}},
			`RUN ["/bin/sh","-c","export A='l1\nl2'; x"]` + "\n",
		},
		{
			"no args is a no-op",
			[]Step{{Type: "ENV", Args: nil}, {Type: "RUN", Args: []string{"x"}}},
			"RUN x\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := render(t, tc.steps...)
			if got := body(res); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			if strings.Contains(string(res.Dockerfile), "\nENV ") {
				t.Fatal("ENV instruction emitted")
			}
		})
	}
}

func TestENVErrors(t *testing.T) {
	for _, args := range [][]string{
		{"A"},
		{"A", "1", "B"},
		{"1A", "x"},
		{"A B", "x"},
		{"A=1; rm -rf /; B", "x"},
		{"", "x"},
		{"A", "x\x00y"},
	} {
		e := renderErr(t, Step{Type: "ENV", Args: args})
		if e.Step != 0 {
			t.Errorf("%q: step %d", args, e.Step)
		}
	}
}

func TestParseUser(t *testing.T) {
	for _, tc := range []struct {
		in       string
		uid, gid *int64
		name     string
	}{
		{"", nil, nil, ""},
		{"0", ptr(0), nil, ""},
		{"1000", ptr(1000), nil, ""},
		{"1000:1000", ptr(1000), ptr(1000), ""},
		{"0:0", ptr(0), ptr(0), ""},
		{"1000:2000", ptr(1000), ptr(2000), ""},
		{"4294967295", ptr(4294967295), nil, ""},
		{"4294967296", nil, nil, "4294967296"},
		{"user", nil, nil, "user"},
		{"root", nil, nil, "root"},
		{"user:user", nil, nil, "user:user"},
		{"1000:staff", nil, nil, "1000:staff"},
		{"app:1000", nil, nil, "app:1000"},
		{"-1", nil, nil, "-1"},
		{"+5", nil, nil, "+5"},
	} {
		uid, gid, name := ParseUser(tc.in)
		if !reflect.DeepEqual(uid, tc.uid) || !reflect.DeepEqual(gid, tc.gid) || name != tc.name {
			t.Errorf("ParseUser(%q) = %v %v %q", tc.in, deref(uid), deref(gid), name)
		}
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestUSERStep(t *testing.T) {
	for _, tc := range []struct {
		name     string
		users    []string
		uid, gid *int64
		uname    string
	}{
		{"unset", nil, nil, nil, ""},
		{"root by uid", []string{"0"}, ptr(0), nil, ""},
		{"uid", []string{"1000"}, ptr(1000), nil, ""},
		{"uid:gid", []string{"1000:1000"}, ptr(1000), ptr(1000), ""},
		{"name", []string{"user"}, nil, nil, "user"},
		{"last wins", []string{"user", "0"}, ptr(0), nil, ""},
		{"last wins name", []string{"0", "user"}, nil, nil, "user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps []Step
			var want strings.Builder
			for _, u := range tc.users {
				steps = append(steps, Step{Type: "USER", Args: []string{u}})
				want.WriteString("USER " + u + "\n")
			}
			res := render(t, steps...)
			if body(res) != want.String() {
				t.Fatalf("got %q want %q", body(res), want.String())
			}
			if !reflect.DeepEqual(res.RunAsUser, tc.uid) || !reflect.DeepEqual(res.RunAsGroup, tc.gid) || res.RunAsUsername != tc.uname {
				t.Fatalf("got %v %v %q", deref(res.RunAsUser), deref(res.RunAsGroup), res.RunAsUsername)
			}
			if len(tc.users) > 0 && res.User != tc.users[len(tc.users)-1] {
				t.Fatalf("User = %q", res.User)
			}
		})
	}
}

func TestUSERErrors(t *testing.T) {
	for _, args := range [][]string{nil, {}, {""}, {"a", "b"}, {"a b"}, {"a\nRUN evil"}, {"$USER"}, {"a'b"}, {":1000"}} {
		renderErr(t, Step{Type: "USER", Args: args})
	}
}

func TestRUN(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []Step
		want  string
	}{
		{
			"plain",
			[]Step{{Type: "RUN", Args: []string{"apt-get update && apt-get install -y curl"}}},
			"RUN apt-get update && apt-get install -y curl\n",
		},
		{
			"per-step user, no USER seen restores root",
			[]Step{{Type: "RUN", Args: []string{"npm install", "node"}}},
			"USER node\nRUN npm install\nUSER root\n",
		},
		{
			"per-step user restores last USER step",
			[]Step{{Type: "USER", Args: []string{"1000:1000"}}, {Type: "RUN", Args: []string{"apt-get install -y git", "root"}}, {Type: "RUN", Args: []string{"id"}}},
			"USER 1000:1000\nUSER root\nRUN apt-get install -y git\nUSER 1000:1000\nRUN id\n",
		},
		{
			"empty per-step user means none",
			[]Step{{Type: "RUN", Args: []string{"id", ""}}},
			"RUN id\n",
		},
		{
			"multi-line uses exec form",
			[]Step{{Type: "RUN", Args: []string{"echo a\necho b"}}},
			`RUN ["/bin/sh","-c","echo a\necho b"]` + "\n",
		},
		{
			"heredoc marker uses exec form",
			[]Step{{Type: "RUN", Args: []string{"cat <<EOF >/x"}}},
			`RUN ["/bin/sh","-c","cat <<EOF >/x"]` + "\n",
		},
		{
			"trailing backslash uses exec form",
			[]Step{{Type: "RUN", Args: []string{`echo \`}}},
			`RUN ["/bin/sh","-c","echo \\"]` + "\n",
		},
		{
			"JSON-looking command uses exec form",
			[]Step{{Type: "RUN", Args: []string{`["rm","-rf","/"]`}}},
			`RUN ["/bin/sh","-c","[\"rm\",\"-rf\",\"/\"]"]` + "\n",
		},
		{
			"leading space uses exec form",
			[]Step{{Type: "RUN", Args: []string{" echo"}}},
			`RUN ["/bin/sh","-c"," echo"]` + "\n",
		},
		{
			"shell metacharacters stay in shell form",
			[]Step{{Type: "RUN", Args: []string{`echo "$HOME" '$x' <a >b & # c`}}},
			`RUN echo "$HOME" '$x' <a >b & # c` + "\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := render(t, tc.steps...)
			if got := body(res); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestRUNUserDoesNotChangeRunAs(t *testing.T) {
	res := render(t, Step{Type: "RUN", Args: []string{"npm install", "node"}})
	if res.RunAsUser != nil || res.RunAsGroup != nil || res.RunAsUsername != "" || res.User != "" {
		t.Fatalf("RUN user changed run-as: %+v", res)
	}
	res = render(t, Step{Type: "USER", Args: []string{"0"}}, Step{Type: "RUN", Args: []string{"x", "1000"}})
	if res.RunAsUser == nil || *res.RunAsUser != 0 || res.User != "0" {
		t.Fatalf("run-as after RUN user: %+v", res)
	}
}

func TestRUNErrors(t *testing.T) {
	for _, args := range [][]string{nil, {}, {""}, {"  "}, {"a", "b", "c"}, {"x", "bad user"}, {"x", "u\nRUN y"}, {"a\x00b"}} {
		renderErr(t, Step{Type: "RUN", Args: args})
	}
}

func TestCOPY(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  string
		args []string
		want string
	}{
		{"two args", "COPY", []string{"app", "/app"}, "COPY " + hashA + "/app /app\n"},
		{"four empty", "COPY", []string{"app", "/app", "", ""}, "COPY " + hashA + "/app /app\n"},
		{"chown chmod", "COPY", []string{"requirements.txt", "/home/user/", "appuser", "0644"},
			"COPY --chown=appuser --chmod=0644 " + hashA + "/requirements.txt /home/user/\n"},
		{"chown only", "COPY", []string{"a", "/b", "1000:1000", ""}, "COPY --chown=1000:1000 " + hashA + "/a /b\n"},
		{"chmod only 3 digits", "COPY", []string{"a", "/b", "", "755"}, "COPY --chmod=755 " + hashA + "/a /b\n"},
		{"ADD is COPY", "ADD", []string{"a.tar.gz", "/opt/"}, "COPY " + hashA + "/a.tar.gz /opt/\n"},
		{"dotdot inside a name is fine", "COPY", []string{"a..b", "/x"}, "COPY " + hashA + "/a..b /x\n"},
		{"dot source", "COPY", []string{".", "/srv"}, "COPY " + hashA + "/. /srv\n"},
		{"glob stays live", "COPY", []string{"*.txt", "/app/"}, "COPY " + hashA + "/*.txt /app/\n"},
		{"relative dest", "COPY", []string{"a", "b"}, "COPY " + hashA + "/a b\n"},
		{"workspaces is another dir", "COPY", []string{"a", "/workspaces/a"}, "COPY " + hashA + "/a /workspaces/a\n"},
		{"workspace-x is another dir", "COPY", []string{"a", "/workspace-x"}, "COPY " + hashA + "/a /workspace-x\n"},
		{"spaces use JSON form", "COPY", []string{"my file", "/opt/my dir/", "", "0600"},
			`COPY --chmod=0600 ["` + hashA + `/my file","/opt/my dir/"]` + "\n"},
		{"dollar and quotes escaped", "COPY", []string{`$HOME'"`, `/d\x`},
			"COPY " + hashA + `/\$HOME\'\" /d\\x` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := render(t, Step{Type: tc.typ, Args: tc.args, FilesHash: hashA})
			if got := body(res); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestCOPYErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		hash   string
		reason string
	}{
		{"absolute src", []string{"/etc/passwd", "/x"}, hashA, "must be relative"},
		{"dotdot src", []string{"../secret", "/x"}, hashA, "'..'"},
		{"inner dotdot src", []string{"a/../../b", "/x"}, hashA, "'..'"},
		{"dest workspace", []string{"a", "/workspace"}, hashA, "/workspace"},
		{"dest workspace slash", []string{"a", "/workspace/"}, hashA, "/workspace"},
		{"dest under workspace", []string{"a", "/workspace/x"}, hashA, "/workspace"},
		{"dest workspace unclean", []string{"a", "//workspace/./x"}, hashA, "/workspace"},
		{"dest relative to / ", []string{"a", "workspace/x"}, hashA, "/workspace"},
		{"bad mode letters", []string{"a", "/b", "", "rw-r--r--"}, hashA, "octal"},
		{"bad mode digit 8", []string{"a", "/b", "", "0648"}, hashA, "octal"},
		{"bad mode short", []string{"a", "/b", "", "64"}, hashA, "octal"},
		{"bad mode long", []string{"a", "/b", "", "00644"}, hashA, "octal"},
		{"bad mode 0o", []string{"a", "/b", "", "0o644"}, hashA, "octal"},
		{"bad chown", []string{"a", "/b", "a b", ""}, hashA, "user"},
		{"three args", []string{"a", "/b", "u"}, hashA, "arguments"},
		{"one arg", []string{"a"}, hashA, "arguments"},
		{"empty src", []string{"", "/b"}, hashA, "non-empty"},
		{"newline dest", []string{"a", "/b\nRUN x"}, hashA, "control"},
		{"missing filesHash", []string{"a", "/b"}, "", "missing context for COPY step 0"},
		{"uppercase hash", []string{"a", "/b"}, strings.ToUpper(hashA), "64 lowercase hex"},
		{"short hash", []string{"a", "/b"}, "abc123", "64 lowercase hex"},
		{"path hash", []string{"a", "/b"}, "../" + hashA[3:], "64 lowercase hex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := renderErr(t, Step{Type: "COPY", Args: tc.args, FilesHash: tc.hash})
			if e.Step != 0 || !strings.Contains(e.Reason, tc.reason) {
				t.Fatalf("got step %d %q, want %q", e.Step, e.Reason, tc.reason)
			}
		})
	}
}

func TestCOPYMissingTar(t *testing.T) {
	steps := []Step{
		{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hashA},
		{Type: "COPY", Args: []string{"b", "/b"}, FilesHash: hashB},
	}
	_, err := Render(BuildStart{FromImage: "x", Steps: steps}, "x", bid, func(h string) bool { return h == hashA })
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrInvalid) || e.Step != 1 || e.Reason != "missing context for COPY step 1" {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "missing context for COPY step 1") {
		t.Fatalf("message %q", err)
	}
}

func TestHashesDistinctInOrder(t *testing.T) {
	res := render(t,
		Step{Type: "COPY", Args: []string{"b", "/b"}, FilesHash: hashB},
		Step{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hashA},
		Step{Type: "COPY", Args: []string{"b2", "/b2"}, FilesHash: hashB},
	)
	if !reflect.DeepEqual(res.Hashes, []string{hashB, hashA}) {
		t.Fatalf("Hashes = %v", res.Hashes)
	}
}

func TestWORKDIR(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dirs    []string
		workdir string
		wantErr bool
	}{
		{"absolute", []string{"/app"}, "/app", false},
		{"workspaces", []string{"/workspaces"}, "/workspaces", false},
		{"relative chain", []string{"/home", "user"}, "/home/user", false},
		{"spaces", []string{"/my dir"}, "/my dir", false},
		{"workspace", []string{"/workspace"}, "", true},
		{"workspace slash", []string{"/workspace/"}, "", true},
		{"under workspace", []string{"/workspace/x"}, "", true},
		{"relative to root", []string{"workspace"}, "", true},
		{"relative onto workspace", []string{"/", "workspace"}, "", true},
		{"dotdot onto workspace", []string{"/app/../workspace"}, "", true},
		{"empty", []string{""}, "", true},
		{"newline", []string{"/a\nRUN x"}, "", true},
		{"trailing space", []string{"/a "}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps []Step
			for _, d := range tc.dirs {
				steps = append(steps, Step{Type: "WORKDIR", Args: []string{d}})
			}
			if tc.wantErr {
				e := renderErr(t, steps...)
				if e.Step != len(steps)-1 {
					t.Fatalf("step %d", e.Step)
				}
				return
			}
			res := render(t, steps...)
			if res.Workdir != tc.workdir {
				t.Fatalf("Workdir = %q", res.Workdir)
			}
			want := ""
			for _, d := range tc.dirs {
				want += "WORKDIR " + d + "\n"
			}
			if body(res) != want {
				t.Fatalf("got %q want %q", body(res), want)
			}
		})
	}
	// Relative COPY destinations resolve against WORKDIR too.
	e := renderErr(t, Step{Type: "WORKDIR", Args: []string{"/"}}, Step{Type: "COPY", Args: []string{"a", "workspace"}, FilesHash: hashA})
	if e.Step != 1 {
		t.Fatalf("step %d", e.Step)
	}
	render(t, Step{Type: "WORKDIR", Args: []string{"/app"}}, Step{Type: "COPY", Args: []string{"a", "workspace"}, FilesHash: hashA})
	renderErr(t, Step{Type: "WORKDIR", Args: []string{"a", "b"}})
}

func TestStepForceCacheBust(t *testing.T) {
	bust := "ARG CUBICLE_CACHEBUST=" + bid + "\n"
	for _, tc := range []struct {
		name  string
		steps []Step
		want  string
	}{
		{
			"before the forced RUN only",
			[]Step{
				{Type: "RUN", Args: []string{"one"}},
				{Type: "RUN", Args: []string{"two"}, Force: true},
				{Type: "RUN", Args: []string{"three"}},
			},
			"RUN one\n" + bust + "RUN two\nRUN three\n",
		},
		{
			"before a forced COPY",
			[]Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hashA, Force: true}, {Type: "RUN", Args: []string{"x"}}},
			bust + "COPY " + hashA + "/a /a\nRUN x\n",
		},
		{
			"before the USER wrapper of a forced RUN",
			[]Step{{Type: "RUN", Args: []string{"x", "root"}, Force: true}},
			bust + "USER root\nRUN x\nUSER root\n",
		},
		{
			"forced ENV moves to the next instruction",
			[]Step{{Type: "RUN", Args: []string{"a"}}, {Type: "ENV", Args: []string{"K", "v"}, Force: true}, {Type: "WORKDIR", Args: []string{"/w"}}},
			"RUN a\n" + bust + "WORKDIR /w\n",
		},
		{
			"forced ENV as the last step emits nothing",
			[]Step{{Type: "RUN", Args: []string{"a"}}, {Type: "ENV", Args: []string{"K", "v"}, Force: true}},
			"RUN a\n",
		},
		{
			"forced USER and WORKDIR",
			[]Step{{Type: "USER", Args: []string{"1000"}, Force: true}, {Type: "WORKDIR", Args: []string{"/w"}, Force: true}},
			bust + "USER 1000\n" + bust + "WORKDIR /w\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := render(t, tc.steps...)
			if got := body(res); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			if res.NoCache {
				t.Fatal("step force set NoCache")
			}
		})
	}
}

func TestCacheBustNeedsUsableBuildID(t *testing.T) {
	steps := []Step{{Type: "RUN", Args: []string{"x"}, Force: true}}
	for _, id := range []string{"", "a b", "x\nRUN y"} {
		_, err := Render(BuildStart{FromImage: "x", Steps: steps}, "x", id, all)
		if err == nil || errors.Is(err, ErrInvalid) {
			t.Errorf("build id %q: err = %v, want a non-400 error", id, err)
		}
	}
	// Without a forced step the build id is not used.
	if _, err := Render(BuildStart{FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{"x"}}}}, "x", "", all); err != nil {
		t.Fatal(err)
	}
}

func TestRequestForceNoCache(t *testing.T) {
	res, err := Render(BuildStart{FromImage: "x", Force: true, Steps: []Step{{Type: "RUN", Args: []string{"x"}}}}, "x", bid, all)
	if err != nil {
		t.Fatal(err)
	}
	if !res.NoCache {
		t.Fatal("NoCache = false")
	}
	if strings.Contains(string(res.Dockerfile), "ARG") {
		t.Fatal("request force emitted an ARG")
	}
}

func TestStepOfLine(t *testing.T) {
	res := render(t,
		Step{Type: "ENV", Args: []string{"A", "1"}},                                  // 0: no line
		Step{Type: "USER", Args: []string{"1000"}},                                   // 1: line 2
		Step{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hashA, Force: true}, // 2: lines 3-4
		Step{Type: "RUN", Args: []string{"x", "root"}},                               // 3: lines 5-7
		Step{Type: "WORKDIR", Args: []string{"/w"}},                                  // 4: line 8
	)
	want := map[int]int{2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 3, 8: 4}
	if !reflect.DeepEqual(res.StepOfLine, want) {
		t.Fatalf("StepOfLine = %v, want %v\n%s", res.StepOfLine, want, res.Dockerfile)
	}
	lines := strings.Split(strings.TrimSuffix(string(res.Dockerfile), "\n"), "\n")
	if len(lines) != 8 || !strings.HasPrefix(lines[0], "FROM ") || lines[5] != "RUN export A='1'; x" {
		t.Fatalf("lines %q", lines)
	}
}

func TestNULRejected(t *testing.T) {
	for _, st := range []Step{
		{Type: "RUN", Args: []string{"a\x00"}},
		{Type: "ENV", Args: []string{"A", "\x00"}},
		{Type: "WORKDIR", Args: []string{"/a\x00"}},
		{Type: "USER", Args: []string{"u\x00"}},
		{Type: "COPY", Args: []string{"a\x00", "/b"}, FilesHash: hashA},
	} {
		e := renderErr(t, Step{Type: "RUN", Args: []string{"ok"}}, st)
		if e.Step != 1 {
			t.Errorf("%s: step %d", st.Type, e.Step)
		}
	}
}

func TestErrorMessageNamesStep(t *testing.T) {
	_, err := Render(BuildStart{FromImage: "x", Steps: []Step{{Type: "RUN", Args: []string{"a"}}, {Type: "ARG", Args: []string{"X"}}}}, "x", bid, all)
	if err == nil || err.Error() != "invalid template build: step 1: ARG steps are not supported" {
		t.Fatalf("err = %v", err)
	}
}

func TestNilHaveTarSkipsCheck(t *testing.T) {
	if _, err := Render(BuildStart{FromImage: "x", Steps: []Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hashA}}}, "x", bid, nil); err != nil {
		t.Fatal(err)
	}
}

func TestRegistrySecretInStepRejected(t *testing.T) {
	req := BuildStart{
		FromImage:         "registry.example/app:1",
		FromImageRegistry: &Registry{Type: "registry", Username: "ci", Password: "s3cr3t-pw"},
		Steps: []Step{
			{Type: "RUN", Args: []string{"echo ci"}},
			{Type: "RUN", Args: []string{"curl -u ci:s3cr3t-pw https://x"}},
		},
	}
	_, err := Render(req, req.FromImage, bid, all)
	var e *Error
	if !errors.As(err, &e) || e.Step != 1 || strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Fatalf("err = %v", err)
	}
	req.FromImageRegistry = &Registry{Type: "aws", AWSAccessKeyID: "AK", AWSSecretAccessKey: "aws-secret-value", AWSRegion: "us-east-1"}
	req.Steps = []Step{{Type: "ENV", Args: []string{"K", "aws-secret-value"}}}
	if _, err := Render(req, req.FromImage, bid, all); !errors.Is(err, ErrInvalid) {
		t.Fatalf("aws secret: err = %v", err)
	}
	// A username is not a secret, and short values are not matched.
	req.FromImageRegistry = &Registry{Type: "registry", Username: "ci", Password: "pw"}
	req.Steps = []Step{{Type: "RUN", Args: []string{"echo ci pw"}}}
	if _, err := Render(req, req.FromImage, bid, all); err != nil {
		t.Fatal(err)
	}
}

func TestStartReadyCmdNUL(t *testing.T) {
	for _, req := range []BuildStart{
		{FromImage: "x", StartCmd: "a\x00b"},
		{FromImage: "x", ReadyCmd: "\x00"},
	} {
		if _, err := Render(req, "x", bid, all); !errors.Is(err, ErrInvalid) {
			t.Errorf("err = %v", err)
		}
	}
	if _, err := Render(BuildStart{FromImage: "x", StartCmd: "python -m http.server\nx", ReadyCmd: "curl -sf localhost"}, "x", bid, all); err != nil {
		t.Fatal(err)
	}
}
