package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// decodeJSON is decodeBody for callers that do not count unknown fields.
func decodeJSON(body []byte, v any, optional bool) string {
	_, msg := decodeBody(body, v, optional)
	return msg
}

// decodeBody is decode after the body is read: it returns the message of
// the 400 that refuses body, or "", and the unknown top-level keys it let
// through (fields.go has the rules).
func decodeBody(body []byte, v any, optional bool) ([]string, string) {
	if len(bytes.TrimSpace(body)) == 0 {
		if optional {
			return nil, ""
		}
		return nil, "request body is required"
	}
	t := reflect.TypeOf(v)
	var unknown []string
	var err error
	if sb, ok := v.(strictBody); ok {
		err = checkStrict(sb.strictName(), body, t)
	} else {
		unknown, err = checkTop(body, t)
	}
	if err != nil {
		return nil, err.Error()
	}
	if err := json.Unmarshal(body, v); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return nil, fe.Error()
		}
		return nil, "malformed JSON body: " + err.Error()
	}
	return unknown, ""
}

// decodeStrict decodes a template create body, refusing fields it does not
// know by name: CubeSandbox's create-from-image (`image`, `cpu`, `env`...)
// shares the route, and accepting its body would answer 202 for a build
// that ignores what was asked.
func decodeStrict(body []byte, v any) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := err.Error()
		if f, ok := unknownField(err); ok {
			return "unknown field " + f + " in the template request"
		}
		return "malformed JSON body: " + msg
	}
	if dec.More() {
		return "malformed JSON body: data after the JSON object"
	}
	return ""
}

// unknownField is the name (quoted) of the field a DisallowUnknownFields
// decode refused. encoding/json has no typed error for it: its message is
// the only place the name is.
func unknownField(err error) (string, bool) {
	return strings.CutPrefix(err.Error(), "json: unknown field ")
}

// options turns a create body into the manager's options (without the
// caller's key and team), or returns the message of the 400 that refuses it.
// Pure, so the fuzz target can check it; the manager validates the rest.
func (req *newSandbox) options(v2 bool) (control.CreateOptions, string) {
	if req.TemplateID == nil {
		// Required by the spec; an explicit "" still means the base template.
		return control.CreateOptions{}, "templateID is required"
	}
	timeout := int64(15) // v1 spec default
	if v2 {
		timeout = int64(control.DefaultTimeout / time.Second)
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	timeoutD, msg := timeoutDuration(timeout)
	if msg != "" {
		return control.CreateOptions{}, msg
	}
	netw := store.Network{AllowInternet: true, AllowPublicTraffic: true}
	if req.AllowInternetAccess != nil {
		netw.AllowInternet = *req.AllowInternetAccess
	}
	if msg := unsupportedIAM(req.IAM); msg != "" {
		return control.CreateOptions{}, msg
	}
	if req.Network != nil {
		ep, rules, access, msg := parseEgress(req.Network.EgressProxy, req.Network.Rules)
		if msg != "" {
			return control.CreateOptions{}, msg
		}
		netw.EgressProxy, netw.Rules = ep, rules
		netw.DNSServers = req.Network.DNSServers
		if req.Network.AllowPublicTraffic != nil {
			netw.AllowPublicTraffic = *req.Network.AllowPublicTraffic
		}
		netw.AllowOut, netw.DenyOut, netw.MaskRequestHost = req.Network.AllowOut, req.Network.DenyOut, req.Network.MaskRequestHost
		access.apply(&netw)
		if msg := checkMaskRequestHost(req.Network.MaskRequestHost); msg != "" {
			return control.CreateOptions{}, msg
		}
		if msg := checkHTTPSPorts(req.Network.HTTPSPorts); msg != "" {
			return control.CreateOptions{}, msg
		}
		netw.HTTPSPorts = req.Network.HTTPSPorts
	}
	opts := control.CreateOptions{
		TemplateID: *req.TemplateID, Timeout: timeoutD,
		Metadata: req.Metadata, EnvVars: req.EnvVars, Network: netw,
	}
	if req.AutoPause != nil {
		opts.AutoPause = *req.AutoPause
	}
	if req.AutoResume != nil {
		opts.AutoResume = req.AutoResume.Enabled
	}
	if msg := req.lifecycle(&opts); msg != "" {
		return control.CreateOptions{}, msg
	}
	if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		if !opts.AutoPause {
			return control.CreateOptions{}, "autoPauseMemory is only allowed with autoPause"
		}
		if opts.AutoResume {
			return control.CreateOptions{}, "autoResume cannot be enabled with autoPauseMemory: false: a filesystem-only pause is resumed explicitly (connect)"
		}
		opts.PauseFilesystem = true
	}
	for _, vm := range req.VolumeMounts {
		opts.VolumeMounts = append(opts.VolumeMounts, control.VolumeMount{Name: vm.Name, Path: vm.Path, ReadOnly: vm.ReadOnly})
	}
	for _, a := range req.Accelerators {
		opts.Accelerators = append(opts.Accelerators, accel.Request(a))
	}
	return opts, ""
}

// lifecycle applies the lifecycle object over autoPause/autoResume; the two
// spellings may repeat each other but not disagree.
func (req *newSandbox) lifecycle(opts *control.CreateOptions) string {
	l := req.Lifecycle
	if l == nil {
		return ""
	}
	if l.OnTimeout != nil {
		var pause bool
		switch *l.OnTimeout {
		case "kill":
		case "pause":
			pause = true
		default:
			return fmt.Sprintf("lifecycle.onTimeout: %q is not kill or pause", *l.OnTimeout)
		}
		if req.AutoPause != nil && *req.AutoPause != pause {
			return "lifecycle.onTimeout and autoPause disagree: send one of them"
		}
		opts.AutoPause = pause
	}
	if l.AutoResume != nil {
		if req.AutoResume != nil && req.AutoResume.Enabled != *l.AutoResume {
			return "lifecycle.autoResume and autoResume.enabled disagree: send one of them"
		}
		opts.AutoResume = *l.AutoResume
	}
	return ""
}

// networkUpdate is the PUT /sandboxes/{id}/network body.
type networkUpdate struct {
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
	AllowInternetAccess *bool    `json:"allow_internet_access"`
	// CubeSandbox's update_network spells it so; both may be sent if
	// they agree.
	AllowInternetAccessCamel *bool           `json:"allowInternetAccess"`
	EgressProxy              json.RawMessage `json:"egressProxy"`
	Rules                    json.RawMessage `json:"rules"`
	DNSServers               *[]string       `json:"dnsServers"`
	// Create-only: refused here by name rather than dropped.
	MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
	AllowPublicTraffic json.RawMessage `json:"allowPublicTraffic"`
}

// strictName makes the whole body a boundary object: every key is refused
// unless implemented (fields.go).
func (*networkUpdate) strictName() string { return "network" }

// network is the policy the body asks for (or the message of the 400 that
// refuses it); the manager validates the rest. Omitted fields are cleared,
// as e2b's update replaces the whole egress configuration.
func (req *networkUpdate) network() (store.Network, string) {
	if msg := createOnlyNetwork(req.MaskRequestHost, req.HTTPSPorts, req.AllowPublicTraffic); msg != "" {
		return store.Network{}, msg
	}
	n := store.Network{AllowInternet: true, AllowOut: req.AllowOut, DenyOut: req.DenyOut}
	if a, b := req.AllowInternetAccess, req.AllowInternetAccessCamel; a != nil && b != nil && *a != *b {
		return store.Network{}, "network: allow_internet_access and allowInternetAccess disagree: send one of them"
	}
	if req.AllowInternetAccess != nil {
		n.AllowInternet = *req.AllowInternetAccess
	} else if req.AllowInternetAccessCamel != nil {
		n.AllowInternet = *req.AllowInternetAccessCamel
	}
	ep, rules, access, msg := parseEgress(req.EgressProxy, req.Rules)
	if msg != "" {
		return store.Network{}, msg
	}
	n.EgressProxy, n.Rules = ep, rules
	access.apply(&n)
	n.DNSServers = req.DNSServers
	return n, ""
}

// volumeName is the requested name ("" for a generated one), or the message
// of the 400 that refuses an explicit empty one.
// sizeMB is the asked size in MiB (0 when absent: the server default).
func (req *newVolume) sizeMB() (int, string) {
	if req.Size == nil {
		return 0, ""
	}
	n := *req.Size
	switch {
	case n <= 0:
		return 0, fmt.Sprintf("volume size %d must be a positive number of bytes; omit it for the server default", n)
	case n%(1<<20) != 0:
		return 0, fmt.Sprintf("volume size %d is not a whole number of MiB (multiples of 1048576 bytes)", n)
	case n>>20 > math.MaxInt32:
		return 0, fmt.Sprintf("volume size %d is too large", n)
	}
	return int(n >> 20), ""
}

func (req *newVolume) volumeName() (string, string) {
	if req.Name == nil {
		return "", ""
	}
	if *req.Name == "" {
		return "", "volume name must not be empty; omit it to get a generated one"
	}
	return *req.Name, ""
}
