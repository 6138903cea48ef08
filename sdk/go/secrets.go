package cubicle

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"
)

// Secret is a secret's metadata. Its value is write-only: no call returns
// it; the node's egress proxy resolves `${e2b.secrets.<name>}` placeholders
// with it at request time.
type Secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

// SecretPage is one page of ListSecrets; NextToken is "" on the last page.
type SecretPage struct {
	Secrets   []Secret
	NextToken string
}

// ListSecretsOptions pages ListSecrets.
type ListSecretsOptions struct {
	Limit     int // 0 = the server's default
	NextToken string
}

// SecretPlaceholder returns "${e2b.secrets.<name>}", the text a network
// rule's header value (NetworkTransform.Headers) holds to have the egress
// proxy fill in the secret's current value at request time (e2b's
// Secret.fill). It makes no request and does not check that the secret
// exists. A name that is empty, not UTF-8, or holds '{', '}' or a control
// character (U+0000-U+001F, U+007F-U+009F) is an ErrInvalidArgument, as in
// e2b's SDKs: no secret can have it, and the placeholder would not read
// back as that name.
func SecretPlaceholder(name string) (string, error) {
	if err := checkSecretName(name); err != nil {
		return "", err
	}
	return "${e2b.secrets." + name + "}", nil
}

// checkSecretName is e2b's INVALID_SECRET_NAME_CHARS rule (plus UTF-8).
func checkSecretName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: secret name is empty", ErrInvalidArgument)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%w: secret name %q is not UTF-8", ErrInvalidArgument, name)
	}
	for _, r := range name {
		if r == '{' || r == '}' || r <= 0x1f || (r >= 0x7f && r <= 0x9f) {
			return fmt.Errorf("%w: secret name %q holds %q: a name cannot contain '{', '}' or control characters, since it is put in ${e2b.secrets.<name>}", ErrInvalidArgument, name, r)
		}
	}
	return nil
}

// CreateSecret stores a new secret (version 1). The server lower-cases the
// name (e2b's schema; the returned Name is that form) and refuses one that
// starts with "sec_", the ID prefix (ErrInvalidArgument). The name is
// unique within the team (ErrConflict when taken); metadata may be nil.
func (c *Client) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (*Secret, error) {
	body := map[string]any{"name": name, "value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	var s Secret
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/secrets", body: body, out: &s}); err != nil {
		return nil, err
	}
	return &s, nil
}

// UpdateSecret stores value as the secret's new current version; a non-nil
// metadata replaces the secret's metadata. ErrSecretNotFound when missing.
func (c *Client) UpdateSecret(ctx context.Context, idOrName, value string, metadata map[string]string) (*Secret, error) {
	body := map[string]any{"value": value}
	if metadata != nil {
		body["metadata"] = metadata
	}
	var s Secret
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/secrets/" + seg(idOrName), body: body, out: &s, res: resSecret}); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetSecret returns a secret's metadata by ID ("sec_…") or name.
func (c *Client) GetSecret(ctx context.Context, idOrName string) (*Secret, error) {
	var s Secret
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/secrets/" + seg(idOrName), out: &s, res: resSecret}); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSecrets returns one page of the team's secrets, oldest first.
func (c *Client) ListSecrets(ctx context.Context, o *ListSecretsOptions) (*SecretPage, error) {
	q := url.Values{}
	if o != nil {
		if o.Limit < 0 {
			return nil, fmt.Errorf("%w: negative limit", ErrInvalidArgument)
		}
		if o.Limit > 0 {
			q.Set("limit", strconv.Itoa(o.Limit))
		}
		if o.NextToken != "" {
			q.Set("nextToken", o.NextToken)
		}
	}
	p := &SecretPage{}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/secrets", query: q, out: &p.Secrets})
	if err != nil {
		return nil, err
	}
	if p.Secrets == nil {
		p.Secrets = []Secret{}
	}
	p.NextToken = resp.header.Get("X-Next-Token")
	return p, nil
}

// DeleteSecret deletes a secret and its value: ErrSecretNotFound when missing.
func (c *Client) DeleteSecret(ctx context.Context, idOrName string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/secrets/" + seg(idOrName), res: resSecret})
	return err
}
