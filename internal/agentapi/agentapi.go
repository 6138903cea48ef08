// Package agentapi is the contract between the in-sandbox agent and those
// who call it (the node, the proxy, the control plane): the bodies both
// sides encode and decode, and the few constants and functions both must
// agree on. The agent is a leaf; nobody imports its implementation.
package agentapi

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// PathInSandbox is where the node bind-mounts the agent binary in every
// sandbox (read-only): commands the control plane runs there may call it.
const PathInSandbox = "/.cubicle/cubicle-agent"

// ProbeHTTPFlag makes the agent binary probe a URL and exit: 0 when it
// answers 200-399 within 5 s (a Kubernetes httpGet probe's success), 1
// otherwise. It needs nothing from the image, not even curl.
const ProbeHTTPFlag = "-probe-http"

// HTTPProbeCommand is the shell command that probes port and path inside
// the sandbox, through the agent binary.
func HTTPProbeCommand(port int, path string) string {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := "http://127.0.0.1:" + strconv.Itoa(port) + path
	return PathInSandbox + " " + ProbeHTTPFlag + " '" + strings.ReplaceAll(u, "'", `'\''`) + "'"
}

// EnvdVersion is the envd version the agent is compatible with; the control
// plane reports it to SDKs, which gate features on it.
const EnvdVersion = "0.6.13"

// Init is the body of POST /init. The node sends it on every boot, claim,
// resume and network change; the agent applies it (internal/agent, rest.go).
// Fields are in name order and optional ones are pointers or omitempty, so
// the node's bytes are the same as when it sent a map.
//
// A nil pointer is "not sent" (the agent keeps what it has): AccessToken
// and DefaultUser are always sent by the node, DefaultWorkdir only when set.
// Fields the agent does not act on (e2b's volumeMounts, hyperloopIP,
// lifecycleID, caBundle) are accepted and ignored by the agent's decoder.
type Init struct {
	AccessToken    *string `json:"accessToken"`
	DefaultUser    *string `json:"defaultUser"`
	DefaultWorkdir *string `json:"defaultWorkdir,omitempty"`
	// EgressCA is the node's interception CA (PEM), sent only to sandboxes
	// whose egress policy has rules: the agent installs it before anything
	// else is applied, and it stays.
	EgressCA string            `json:"egressCA,omitempty"`
	EnvVars  map[string]string `json:"envVars"`
	// StartCmd is a template's start command: the first /init with a
	// non-empty one starts it as StartUser (a name, "uid" or "uid:gid";
	// empty: the default user after this /init) in StartWorkdir (empty: the
	// user's home). Later ones ignore all three. The node sends StartUser
	// and StartWorkdir exactly when it sends StartCmd.
	StartCmd     string  `json:"startCmd,omitempty"`
	StartUser    *string `json:"startUser,omitempty"`
	StartWorkdir *string `json:"startWorkdir,omitempty"`
	// Timestamp is when the node sent it (the agent does not set the clock
	// from it: in a container the clock is the host's).
	Timestamp *time.Time `json:"timestamp"`
}

// AccelCheckRequest is the body of POST /cubicle/accelerators/check: the
// guest stage of the accelerator compatibility contract, run by the node
// after a sandbox with devices boots.
type AccelCheckRequest struct {
	Devices   []string `json:"devices"`   // device nodes that must be visible
	Libraries []string `json:"libraries"` // file names that must be in LibDirs
	LibDirs   []string `json:"libDirs"`
	Check     string   `json:"check"`    // command that must exit 0 (nvidia-smi)
	Ldconfig  bool     `json:"ldconfig"` // refresh the loader cache first (libraries are bind-mounted)
	TimeoutMs int      `json:"timeoutMs"`
}

// AccelFailure names the layer that failed (accel.Layer values).
type AccelFailure struct {
	Layer  string `json:"layer"`
	Detail string `json:"detail"`
}

// AccelCheckResponse reports every failure, not only the first.
type AccelCheckResponse struct {
	OK         bool           `json:"ok"`
	Failures   []AccelFailure `json:"failures"`
	Output     string         `json:"output"`
	DurationMs int64          `json:"durationMs"`
}

// The /files signature errors carry envd's texts (packages/envd/internal/api/
// auth.go, validateSigning) because SDK users read them; all answer 401.
var (
	ErrMissingSignature = errors.New("missing signature query parameter")
	ErrInvalidSignature = errors.New("invalid signature")
	ErrExpiredSignature = errors.New("signature is already expired")
)

// Signature computes envd's v1 signature for a /files URL.
// exp is zero when the URL has no expiration.
func Signature(path, op, user, token string, exp int64) string {
	parts := []string{path, op, user, token}
	if exp != 0 {
		parts = append(parts, strconv.FormatInt(exp, 10))
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
