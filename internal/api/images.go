package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/image"
)

// DefaultMaxImageBytes caps an image import body unless Config says otherwise.
const DefaultMaxImageBytes int64 = 4 << 30

// Images is the local image store the API imports into.
type Images interface {
	ImportTar(ref, path string) error
	List() ([]image.Entry, error)
	Delete(ref string) error
	Dir() string
}

// importImage takes a rootfs tar(.gz), an OCI layout tar or a docker-save
// tar as the body and stores it as ?ref=.
func (s *Server) importImage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Images == nil {
		writeError(w, http.StatusNotImplemented, "the image store is not enabled on this server")
		return
	}
	ref := r.URL.Query().Get("ref")
	norm, err := image.NormalizeRef(ref)
	if err != nil {
		writeError(w, http.StatusBadRequest, "ref: "+err.Error())
		return
	}
	if reservedImage(w, norm) {
		return
	}
	max := s.cfg.MaxImageBytes
	tooLarge := func() {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("image body larger than %d bytes (serve --max-image-bytes)", max))
	}
	if r.ContentLength > max {
		tooLarge()
		return
	}
	tmp, err := os.CreateTemp(s.cfg.Images.Dir(), ".import-")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := io.Copy(tmp, http.MaxBytesReader(w, r.Body, max)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge()
			return
		}
		writeError(w, http.StatusBadRequest, "reading the image body: "+err.Error())
		return
	}
	if err := s.cfg.Images.ImportTar(ref, tmp.Name()); err != nil {
		if errors.Is(err, image.ErrInvalidRef) || errors.Is(err, image.ErrNotFound) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "import: "+err.Error())
		return
	}
	ref, _ = image.NormalizeRef(ref)
	writeJSON(w, http.StatusCreated, map[string]any{"ref": ref})
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Images == nil {
		writeError(w, http.StatusNotImplemented, "the image store is not enabled on this server")
		return
	}
	es, err := s.cfg.Images.List()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if es == nil {
		es = []image.Entry{}
	}
	writeJSON(w, http.StatusOK, es)
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Images == nil {
		writeError(w, http.StatusNotImplemented, "the image store is not enabled on this server")
		return
	}
	if norm, err := image.NormalizeRef(r.URL.Query().Get("ref")); err == nil && reservedImage(w, norm) {
		return
	}
	if err := s.cfg.Images.Delete(r.URL.Query().Get("ref")); err != nil {
		if errors.Is(err, image.ErrNotFound) {
			writeError(w, http.StatusNotFound, err.Error())
			return
		}
		if errors.Is(err, image.ErrInvalidRef) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// reservedImage refuses (403) an import or delete of a built-in's
// repository: serve --publish-builtins owns builtin/<name>, and nodes boot
// whatever it names there.
func reservedImage(w http.ResponseWriter, ref string) bool {
	if !strings.HasPrefix(ref, builtinimage.RepositoryPrefix) {
		return false
	}
	writeError(w, http.StatusForbidden, fmt.Sprintf("ref %s: repositories %s* hold the built-in images serve --publish-builtins publishes; they cannot be imported or deleted", ref, builtinimage.RepositoryPrefix))
	return true
}
