package recipe

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// FuzzRender: a template build body either renders or is refused with an
// *Error wrapping ErrInvalid that names a real step; a rendered Dockerfile
// parses to exactly one instruction per line it emitted (no argument can
// inject a line, a continuation or a heredoc), has one FROM (the base), only
// the instructions the renderer writes, every line after FROM mapped to its
// step, and each RUN instruction hands /bin/sh exactly the step's command.
func FuzzRender(f *testing.F) {
	for _, s := range []string{
		`{"fromImage":"python:3.12","steps":[{"type":"COPY","args":["app","/app","",""],"filesHash":"` + hashA + `"},{"type":"RUN","args":["pip install -r /app/req.txt"]},{"type":"ENV","args":["FOO","bar"]},{"type":"WORKDIR","args":["/app"]}]}`,
		`{"fromTemplate":"base","steps":[{"type":"USER","args":["user"]},{"type":"RUN","args":["echo hi","root"],"force":true}]}`,
		`{"fromImage":"alpine","steps":[{"type":"RUN","args":["echo a\nFROM evil\nRUN b"]}]}`,
		`{"fromImage":"alpine","steps":[{"type":"RUN","args":["cat <<EOF\nx\nEOF"]},{"type":"RUN","args":["echo \\"]},{"type":"RUN","args":["[\"x\"]"]}]}`,
		`{"fromImage":"alpine","steps":[{"type":"ENV","args":["A","$(id)'\"","B","x\ny"]},{"type":"RUN","args":["env"]}]}`,
		`{"fromImage":"alpine","steps":[{"type":"WORKDIR","args":["../../etc"]},{"type":"COPY","args":["a b","$HOME/x","user","0755"],"filesHash":"` + hashB + `"}]}`,
		`{"fromImage":"alpine","fromImageRegistry":{"type":"registry","username":"u","password":"hunter22"},"steps":[{"type":"RUN","args":["echo hunter22"]}]}`,
		`{"fromImage":"alpine","steps":[{"type":"ARG","args":["X"]},{"type":"","args":[]}]}`,
		`{"fromImage":"alpine","startCmd":"python main.py","readyCmd":"sleep 1","force":true,"steps":[]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req BuildStart
		if json.Unmarshal([]byte(body), &req) != nil {
			return
		}
		base := req.FromImage
		if base == "" {
			base = "cubicle/base:latest"
		}
		res, err := Render(req, base, bid, all)
		if err != nil {
			var e *Error
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Step < -1 || e.Step >= len(req.Steps) {
				t.Fatalf("error %v (%T) is not a step's *Error", err, err)
			}
			return
		}
		again, err := Render(req, base, bid, all)
		if err != nil || !bytes.Equal(again.Dockerfile, res.Dockerfile) {
			t.Fatalf("Render is not deterministic: %v", err)
		}
		lines := strings.Count(string(res.Dockerfile), "\n")
		parsed, err := parser.Parse(bytes.NewReader(res.Dockerfile))
		if err != nil {
			t.Fatalf("rendered Dockerfile does not parse: %v\n%s", err, res.Dockerfile)
		}
		nodes := parsed.AST.Children
		if len(nodes) != lines {
			t.Fatalf("%d instructions from %d lines:\n%s", len(nodes), lines, res.Dockerfile)
		}
		var runs []*parser.Node
		for i, n := range nodes {
			if n.StartLine != i+1 || n.EndLine != i+1 || len(n.Heredocs) > 0 {
				t.Fatalf("instruction %d spans lines %d-%d:\n%s", i, n.StartLine, n.EndLine, res.Dockerfile)
			}
			switch strings.ToLower(n.Value) {
			case "from":
				if i != 0 || n.Next == nil || n.Next.Value != base {
					t.Fatalf("FROM at line %d: %q", i+1, n.Original)
				}
				continue
			case "run":
				runs = append(runs, n)
			case "arg", "env", "workdir", "user", "copy":
			default:
				t.Fatalf("unexpected instruction %q", n.Original)
			}
			if _, ok := res.StepOfLine[i+1]; !ok {
				t.Fatalf("line %d (%q) has no step", i+1, n.Original)
			}
		}
		// Without ENV steps, each RUN's shell command is the step's own.
		var want []string
		for _, st := range req.Steps {
			switch strings.ToUpper(st.Type) {
			case "ENV":
				return
			case "RUN":
				want = append(want, st.Args[0])
			}
		}
		if len(runs) != len(want) {
			t.Fatalf("%d RUN instructions for %d RUN steps", len(runs), len(want))
		}
		for i, n := range runs {
			var args []string
			for a := n.Next; a != nil; a = a.Next {
				args = append(args, a.Value)
			}
			got := strings.Join(args, " ")
			if n.Attributes["json"] {
				if len(args) != 3 || args[0] != "/bin/sh" || args[1] != "-c" {
					t.Fatalf("RUN exec form %q", args)
				}
				got = args[2]
			}
			if got != want[i] {
				t.Fatalf("RUN runs %q, step said %q", got, want[i])
			}
		}
	})
}
