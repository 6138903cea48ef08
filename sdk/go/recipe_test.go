package cubicle

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func mustParse(t *testing.T, src string) *Recipe {
	t.Helper()
	r, err := ParseRecipe("Recipe", src)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, src)
	}
	return r
}

func stepsOf(r *Recipe) [][]string {
	var out [][]string
	for _, s := range r.Steps {
		out = append(out, append([]string{s.Type}, s.Args...))
	}
	return out
}

func TestRecipeEveryInstruction(t *testing.T) {
	src := `# syntax comment
FROM cubicle/base:1 AS build
RUN apt-get update && \
    # a comment inside a continuation
    apt-get install -y curl

run ["sh", "-c", "echo it's"]
COPY --chown=user:user --chmod=755 app req.txt /opt/app/
ADD ./data /data
COPY ["a b.txt", "/dst dir/"]
ENV A=1 B="two words" C=x\ y
ENV LEGACY value with  spaces
ENV Q "quoted legacy"
WORKDIR /srv/app
USER user
EXPOSE 8080
LABEL a=b
VOLUME /data
SHELL ["/bin/bash", "-c"]
ENTRYPOINT ["python", "-m", "http.server"]
CMD ["8000"]
# cubicle:ready curl -sf localhost:8000
`
	r := mustParse(t, src)
	if r.FromImage != "cubicle/base:1" || r.FromTemplate != "" {
		t.Errorf("from: %q %q", r.FromImage, r.FromTemplate)
	}
	want := [][]string{
		{"RUN", "apt-get update &&     apt-get install -y curl"},
		{"RUN", `sh -c 'echo it'\''s'`},
		{"COPY", "app", "/opt/app/", "user:user", "0755"},
		{"COPY", "req.txt", "/opt/app/", "user:user", "0755"},
		{"COPY", "./data", "/data", "", ""},
		{"COPY", "a b.txt", "/dst dir/", "", ""},
		{"ENV", "A", "1", "B", "two words", "C", "x y"},
		{"ENV", "LEGACY", "value with  spaces"},
		{"ENV", "Q", "quoted legacy"},
		{"WORKDIR", "/srv/app"},
		{"USER", "user"},
	}
	if got := stepsOf(r); !reflect.DeepEqual(got, want) {
		t.Errorf("steps:\n got %q\nwant %q", got, want)
	}
	if r.StartCmd != "python -m http.server 8000" {
		t.Errorf("startCmd %q", r.StartCmd)
	}
	if r.ReadyCmd != "curl -sf localhost:8000" {
		t.Errorf("readyCmd %q", r.ReadyCmd)
	}
	if r.Steps[0].line != 3 || r.Steps[1].line != 7 {
		t.Errorf("lines %d %d", r.Steps[0].line, r.Steps[1].line)
	}
	joined := strings.Join(r.Warnings, "\n")
	for _, w := range []string{"EXPOSE is ignored", "LABEL is ignored", "VOLUME is ignored", "SHELL is ignored", "ADD is treated as COPY"} {
		if !strings.Contains(joined, w) {
			t.Errorf("warnings lack %q:\n%s", w, joined)
		}
	}
}

func TestRecipeStartAndReady(t *testing.T) {
	for _, c := range []struct{ src, start, ready string }{
		{"FROM x\nCMD python app.py", "python app.py", ""},
		{"FROM x\nCMD [\"a\",\"b c\"]", "a 'b c'", ""},
		{"FROM x\nENTRYPOINT /run.sh\nCMD ignored", "/run.sh", ""},
		{"FROM x\nCMD first\nCMD second", "second", ""},
		{"FROM x\nHEALTHCHECK --interval=5s CMD curl -f localhost", "", "curl -f localhost"},
		{"FROM x\nHEALTHCHECK CMD [\"CMD-SHELL\", \"test -f /ok\"]", "", "test -f /ok"},
		{"FROM x\nHEALTHCHECK CMD [\"test\", \"-f\", \"/ok\"]", "", "test -f /ok"},
		{"FROM x\nHEALTHCHECK CMD a\nHEALTHCHECK NONE", "", ""},
		{"FROM x\n#   cubicle:ready   sleep 1", "", "sleep 1"},
		{"FROM x\n# cubicle:readyish no", "", ""},
	} {
		r := mustParse(t, c.src)
		if r.StartCmd != c.start || r.ReadyCmd != c.ready {
			t.Errorf("%q: start %q ready %q, want %q %q", c.src, r.StartCmd, r.ReadyCmd, c.start, c.ready)
		}
	}
}

func TestRecipeFromTemplate(t *testing.T) {
	r := mustParse(t, "from template:my-base:v2\nRUN true")
	if r.FromTemplate != "my-base:v2" || r.FromImage != "" {
		t.Fatalf("%+v", r)
	}
	r = mustParse(t, "FROM --platform=linux/amd64 python:3.12")
	if r.FromImage != "python:3.12" || len(r.Warnings) != 1 {
		t.Fatalf("%+v", r)
	}
}

func TestRecipeErrors(t *testing.T) {
	for _, c := range []struct {
		src  string
		line int
		want string
	}{
		{"FROM x\nARG V=1", 2, "ARG is not supported"},
		{"ARG V=1\nFROM x", 1, "before FROM"},
		{"RUN true", 1, "before FROM"},
		{"", 0, "no FROM"},
		{"# only a comment", 0, "no FROM"},
		{"FROM x\nFROM y", 2, "multi-stage"},
		{"FROM", 1, "FROM needs one image"},
		{"FROM template:", 1, "template name"},
		{"FROM x\n\nFROBNICATE now", 3, "unknown instruction FROBNICATE"},
		{"FROM x\nRUN <<EOF\necho hi\nEOF", 2, "heredocs"},
		{"FROM x\nRUN cat 2<<-'END' > /f", 2, "heredocs"},
		{"FROM x\nCOPY <<EOF /f\nhi\nEOF", 2, "heredocs"},
		{"FROM x\nRUN --mount=type=cache,target=/c true", 2, "RUN --mount"},
		{"FROM x\nRUN", 2, "RUN needs a command"},
		{"FROM x\nCOPY a", 2, "at least one source"},
		{"FROM x\nCOPY a b /dest", 2, "ending in /"},
		{"FROM x\nCOPY /etc/passwd /p", 2, "relative"},
		{"FROM x\nCOPY ../up /p", 2, "escapes"},
		{"FROM x\nCOPY a/../../up /p", 2, "escapes"},
		{"FROM x\nADD https://example.com/f /f", 2, "URL"},
		{"FROM x\nCOPY --from=build /a /b", 2, "multi-stage"},
		{"FROM x\nCOPY --chmod=u+x a /a", 2, "octal"},
		{"FROM x\nCOPY --chmod=99 a /a", 2, "octal"},
		{"FROM x\nCOPY --exclude=*.md . /a", 2, "--exclude is not supported"},
		{"FROM x\nENV", 2, "KEY=value"},
		{"FROM x\nENV LONELY", 2, "no value"},
		{"FROM x\nENV A=1 B", 2, `"B" is not KEY=value`},
		{"FROM x\nENV A=\"unterminated", 2, "unterminated"},
		{"FROM x\nWORKDIR a b", 2, "exactly one path"},
		{"FROM x\nUSER a b", 2, "exactly one"},
		{"FROM x\nHEALTHCHECK", 2, "CMD or NONE"},
		{"FROM x\nHEALTHCHECK CMD", 2, "needs a command"},
		{"FROM x\n# cubicle:ready", 2, "needs a command"},
	} {
		_, err := ParseRecipe("Recipe", c.src)
		var re *RecipeError
		if !errors.As(err, &re) {
			t.Errorf("%q: want a recipe error, got %v", c.src, err)
			continue
		}
		if re.Line != c.line || !strings.Contains(re.Msg, c.want) {
			t.Errorf("%q: got line %d %q, want line %d containing %q", c.src, re.Line, re.Msg, c.line, c.want)
		}
		if c.line > 0 && !strings.HasPrefix(err.Error(), fmt.Sprintf("Recipe:%d: ", c.line)) {
			t.Errorf("%q: message %q does not name the line", c.src, err)
		}
	}
}

func TestRecipeWhitespaceAndCase(t *testing.T) {
	r := mustParse(t, "  from   x  \r\n\tRun echo a \\\r\n  b\r\ncopy\ta\t/b\n")
	want := [][]string{{"RUN", "echo a   b"}, {"COPY", "a", "/b", "", ""}}
	if got := stepsOf(r); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
}
