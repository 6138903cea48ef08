package api

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/template/contextstore"
)

// oneStore is the context store as serve wires it, for one directory.
type oneStore struct{ s *contextstore.Store }

func (o oneStore) Has(_, hash string) bool               { return o.s.Has(hash) }
func (o oneStore) Put(_, hash string, b io.Reader) error { return o.s.Put(hash, b) }

// An upload URL is good for one upload: the same URL again, even with the
// same bytes, is refused with e2b's 401, and a token presented for another
// hash neither works nor is spent.
func TestTemplateUploadURLIsOneTime(t *testing.T) {
	cs, err := contextstore.Open(filepath.Join(t.TempDir(), "ctx"), 0)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Templates: &Templates{Contexts: oneStore{cs}, Errors: ContextErrors{
		Conflict: contextstore.ErrConflict, TooLarge: contextstore.ErrTooLarge, BadArchive: contextstore.ErrBadArchive,
		UnsafePath: contextstore.ErrUnsafePath, InvalidHash: contextstore.ErrInvalidHash}}}, nil, nil)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	body := b.Bytes()
	const hash, other = "5d9e391ef8265bdbf5dab1e924668ade1282d8450786c7b0ae91d5dd5405e8c8", "3883a9605d900d6c2e8844fb119d9d39c36c6cb9f8debaa0f75b63b6199438b9"
	tok := s.uploads.grant("t_a", hash)
	put := func(h string) (int, errorBody) {
		req := httptest.NewRequest("PUT", "/template-uploads/"+h+"?token="+tok, bytes.NewReader(body))
		rec := httptest.NewRecorder()
		s.router.ServeHTTP(rec, req)
		var e errorBody
		json.Unmarshal(rec.Body.Bytes(), &e)
		return rec.Code, e
	}
	if code, e := put(other); code != http.StatusUnauthorized || e.Code != 401 {
		t.Fatalf("token for another hash: %d %+v", code, e)
	}
	if code, e := put(hash); code != http.StatusCreated || !cs.Has(hash) {
		t.Fatalf("first upload: %d %+v", code, e)
	}
	if code, e := put(hash); code != http.StatusUnauthorized || e.Code != 401 || !strings.Contains(e.Message, "already used") {
		t.Fatalf("second upload with the same URL: %d %+v", code, e)
	}
}
