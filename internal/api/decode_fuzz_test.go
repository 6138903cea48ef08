package api

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/network"
)

// withUnknownField re-encodes a JSON object body with and without a field no
// decoder knows. ok is false when body is not an object.
func withUnknownField(body string) (plain, extra []byte, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &m) != nil || m == nil {
		return nil, nil, false
	}
	plain, _ = json.Marshal(m)
	m["zzCubicleUnknownField"] = json.RawMessage(`{"timeout":1,"templateID":"x","allowOut":["0.0.0.0/0"]}`)
	extra, _ = json.Marshal(m)
	return plain, extra, true
}

// checkPolicy: entries the network layer accepts are valid prefixes whose
// canonical form parses back to themselves; refusals are typed.
func checkPolicy(t *testing.T, allow, deny []string) {
	t.Helper()
	err := network.ValidatePolicy(network.Policy{AllowOut: allow, DenyOut: deny})
	if err == nil {
		// Domain entries are valid but refused until they are enforced.
		err = network.CheckEnforced(network.Policy{AllowOut: allow, DenyOut: deny})
	}
	if err != nil {
		if !errors.Is(err, network.ErrInvalidPolicy) {
			t.Fatalf("policy error %v is not ErrInvalidPolicy", err)
		}
		return
	}
	for _, s := range append(append([]string{}, allow...), deny...) {
		p, err := network.ParsePrefix(s)
		if err != nil || !p.IsValid() {
			t.Fatalf("accepted %q parses to %v, %v", s, p, err)
		}
		if q, err := network.ParsePrefix(p.String()); err != nil || q != p {
			t.Fatalf("%q: canonical %q parses to %v, %v", s, p, q, err)
		}
	}
}

// checkKnownKeys: an accepted create body has no top-level key that folds
// onto a known one without being it, and only exact known keys in network.
func checkKnownKeys(t *testing.T, body string) {
	t.Helper()
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &top) != nil {
		return
	}
	fs := fieldsOf(reflect.TypeOf(newSandbox{}))
	for k := range top {
		if known, ok := fs.folded[fold(k)]; ok && known != k {
			t.Fatalf("near miss %q of %q accepted", k, known)
		}
	}
	var netw map[string]json.RawMessage
	if json.Unmarshal(top["network"], &netw) != nil {
		return
	}
	nfs := fieldsOf(reflect.TypeOf(networkConfig{}))
	for k := range netw {
		if !nfs.exact[k] {
			t.Fatalf("unknown network key %q accepted", k)
		}
	}
}

// FuzzCreateSandboxBody: the create body either gets a 400 message or
// options whose timeout is exactly the seconds asked (no wrap), whose
// network defaults hold, that an unknown field does not change, and whose
// metadata and network the manager accepts or refuses with typed errors.
func FuzzCreateSandboxBody(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"base","timeout":300,"metadata":{"user":"a"},"envVars":{"A":"b"}}`,
		`{"templateID":"code-interpreter-v1","timeout":60,"secure":true,"allow_internet_access":false,"autoPause":true,"autoResume":{"enabled":true}}`,
		`{"templateID":"base","network":{"allowPublicTraffic":false,"allowOut":["1.1.1.1","10.0.0.0/8"],"denyOut":["0.0.0.0/0"],"maskRequestHost":"x.example"}}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/mnt/v","readOnly":true}],"accelerators":[{"class":"gpu","count":1}]}`,
		`{"templateID":"base","timeout":18446744074}`,
		`{"templateID":"base","timeout":-1}`,
		`{"templateID":""}`,
		`{"timeout":10}`,
		`{"templateID":"base","TIMEOUT":5,"templateid":"other"}`,
		`{"templateID":"base","allowInternetAccess":false,"network":{"deny_out":["0.0.0.0/0"]}}`,
		`{"templateID":"base","futureOption":{"x":1},"autoResume":{"enabled":true,"x":1}}`,
		`{"templateID":"base","network":{"denyOut":["::ffff:169.254.169.254","fe80::1%eth0"]}}`,
		`[]`, `null`, ``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, v2 := range []bool{false, true} {
			var req newSandbox
			if decodeJSON([]byte(body), &req, false) != "" {
				continue
			}
			opts, msg := req.options(v2)
			if msg != "" {
				continue
			}
			if opts.Timeout < 0 || (req.Timeout != nil && opts.Timeout != time.Duration(*req.Timeout)*time.Second) ||
				(req.Timeout != nil && int64(opts.Timeout/time.Second) != *req.Timeout) {
				t.Fatalf("timeout %v for %v seconds", opts.Timeout, *req.Timeout)
			}
			if opts.Network.AllowInternet != (req.AllowInternetAccess == nil || *req.AllowInternetAccess) {
				t.Fatalf("allowInternet %v for %v", opts.Network.AllowInternet, req.AllowInternetAccess)
			}
			if err := control.ValidateMetadata(opts.Metadata); err != nil && !errors.Is(err, control.ErrInvalid) {
				t.Fatalf("metadata error %v is not ErrInvalid", err)
			}
			checkPolicy(t, opts.Network.AllowOut, opts.Network.DenyOut)
			checkKnownKeys(t, body)
			if plain, extra, ok := withUnknownField(body); ok {
				var a, b newSandbox
				if decodeJSON(plain, &a, false) != "" || decodeJSON(extra, &b, false) != "" {
					t.Fatalf("re-encoded body does not decode")
				}
				oa, ma := a.options(v2)
				ob, mb := b.options(v2)
				if ma != mb || !reflect.DeepEqual(oa, ob) {
					t.Fatalf("an unknown field changed the options: %+v vs %+v", oa, ob)
				}
			}
		}
	})
}

// FuzzNetworkUpdateBody: PUT /sandboxes/{id}/network decodes to a policy
// the network layer accepts or refuses with ErrInvalidPolicy, and refuses
// keys it does not know.
func FuzzNetworkUpdateBody(f *testing.F) {
	for _, s := range []string{
		`{"allowOut":["8.8.8.8"],"denyOut":["0.0.0.0/0"],"allow_internet_access":false}`,
		`{"allowOut":[],"denyOut":["169.254.0.0/16","10.0.0.0/8"]}`,
		`{"allowOut":["1.2.3.4/33"]}`,
		`{"denyOut":["example.com"]}`,
		`{"denyOut":["::ffff:10.0.0.1"]}`,
		`{}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req networkUpdate
		if decodeJSON([]byte(body), &req, false) != "" {
			return
		}
		n, msg := req.network()
		if msg != "" {
			return
		}
		asked := req.AllowInternetAccess
		if asked == nil {
			asked = req.AllowInternetAccessCamel
		}
		if n.AllowInternet != (asked == nil || *asked) {
			t.Fatalf("allowInternet %v for %v", n.AllowInternet, asked)
		}
		checkPolicy(t, n.AllowOut, n.DenyOut)
		// The whole body is a network object: an unknown key is refused
		// by name, never dropped.
		if _, extra, ok := withUnknownField(body); ok {
			var b networkUpdate
			if msg := decodeJSON(extra, &b, false); !strings.Contains(msg, `"zzCubicleUnknownField"`) {
				t.Fatalf("an unknown field was not refused: %q", msg)
			}
		}
	})
}

// FuzzVolumeCreateBody: POST /volumes takes an optional body; a name, when
// given, is non-empty or refused.
func FuzzVolumeCreateBody(f *testing.F) {
	for _, s := range []string{`{"name":"data"}`, `{"name":"data","driver":"s3"}`, `{"name":""}`, `{}`, ``, `{"name":null}`, `{"name":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req newVolume
		if decodeJSON([]byte(body), &req, true) != "" {
			return
		}
		name, msg := req.volumeName()
		if msg == "" && req.Name != nil && name == "" {
			t.Fatalf("an explicit empty name was accepted")
		}
		if msg != "" && (req.Name == nil || *req.Name != "") {
			t.Fatalf("refused %q: %s", body, msg)
		}
		if plain, extra, ok := withUnknownField(body); ok {
			var a, b newVolume
			decodeJSON(plain, &a, true)
			decodeJSON(extra, &b, true)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("an unknown field changed the request")
			}
		}
	})
}
