package interp

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"
)

// The lines of an /execute stream, in e2b's shapes.

type streamLine struct {
	Type      string `json:"type"` // stdout or stderr
	Text      string `json:"text"`
	Timestamp string `json:"timestamp"`
}

type errorLine struct {
	Type      string `json:"type"` // error
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type countLine struct {
	Type           string `json:"type"` // number_of_executions
	ExecutionCount int    `json:"execution_count"`
}

type markerLine struct {
	Type string `json:"type"` // end_of_execution, unexpected_end_of_execution, keepalive
}

var (
	endOfExecution           = markerLine{Type: "end_of_execution"}
	unexpectedEndOfExecution = markerLine{Type: "unexpected_end_of_execution"}
	keepalive                = markerLine{Type: "keepalive"}
)

// resultLine is an execute_result or display_data mimebundle: the mime
// types e2b names get a field each, every other one goes to extra.
type resultLine struct {
	Type         string                     `json:"type"` // result
	IsMainResult bool                       `json:"is_main_result"`
	Text         *string                    `json:"text,omitempty"`
	HTML         json.RawMessage            `json:"html,omitempty"`
	Markdown     json.RawMessage            `json:"markdown,omitempty"`
	SVG          json.RawMessage            `json:"svg,omitempty"`
	PNG          json.RawMessage            `json:"png,omitempty"`
	JPEG         json.RawMessage            `json:"jpeg,omitempty"`
	PDF          json.RawMessage            `json:"pdf,omitempty"`
	LaTeX        json.RawMessage            `json:"latex,omitempty"`
	JSON         json.RawMessage            `json:"json,omitempty"`
	JavaScript   json.RawMessage            `json:"javascript,omitempty"`
	Data         json.RawMessage            `json:"data,omitempty"`
	Chart        json.RawMessage            `json:"chart,omitempty"`
	Extra        map[string]json.RawMessage `json:"extra,omitempty"`
}

func newResult(main bool, bundle map[string]json.RawMessage) *resultLine {
	r := &resultLine{Type: "result", IsMainResult: main}
	fields := map[string]*json.RawMessage{
		"text/html":              &r.HTML,
		"text/markdown":          &r.Markdown,
		"image/svg+xml":          &r.SVG,
		"image/png":              &r.PNG,
		"image/jpeg":             &r.JPEG,
		"application/pdf":        &r.PDF,
		"text/latex":             &r.LaTeX,
		"application/json":       &r.JSON,
		"application/javascript": &r.JavaScript,
		"e2b/data":               &r.Data,
		"e2b/chart":              &r.Chart,
	}
	for mime, v := range bundle {
		if mime == "text/plain" {
			var text string
			if json.Unmarshal(v, &text) == nil {
				text = unquote(text)
				r.Text = &text
				continue
			}
		}
		if f, ok := fields[mime]; ok {
			*f = v
			continue
		}
		if r.Extra == nil {
			r.Extra = map[string]json.RawMessage{}
		}
		r.Extra[mime] = v
	}
	return r
}

// unquote strips one pair of surrounding quotes, as e2b does for a string
// result: IPython shows 'abc' for the str "abc".
func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
		return s[1 : len(s)-1]
	}
	return s
}

// ansiEscape matches terminal escape sequences (CSI and OSC). Kernels are
// started without colours; this removes what a kernel adds anyway.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)`)

func newError(name, value string, traceback []string) errorLine {
	return errorLine{
		Type:      "error",
		Name:      name,
		Value:     ansiEscape.ReplaceAllString(value, ""),
		Traceback: ansiEscape.ReplaceAllString(strings.Join(traceback, "\n"), ""),
	}
}

func timestamp(date string) string {
	if date != "" {
		if _, err := time.Parse(time.RFC3339Nano, date); err == nil {
			return date
		}
		// Not RFC 3339 (jjava writes minutes and "+0000"): when the
		// agent saw it is the best time left.
	}
	return time.Now().UTC().Format(time.RFC3339Nano)
}
