package contextstore

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// entry is a checked member: Name is cleaned and relative to the context
// root; for hard links Linkname is cleaned too.
type entry struct {
	hdr      *tar.Header
	Name     string
	Linkname string
}

// validate reads every member of tr, checks it, and calls fn (when non-nil)
// with each member that should be materialised, its body still readable
// from tr. It returns nil only for a complete, safe archive.
//
// Rules: names are relative, free of ".." and never pass through a symlink
// or a non-directory; a name appears once (directories may repeat); only
// files, directories, symlinks and hard links are allowed (devices and
// fifos are ErrUnsafePath); a hard link names an earlier file; a relative
// symlink, resolved through the archive's other symlinks, stays inside.
//
// An absolute symlink is kept as it is, as Docker keeps it in a build
// context: it means a path in the image (the e2b SDK tars symlinks
// unchanged, and BuildKit resolves them inside the build). On the host it is
// inert, since no later member may pass through a symlink and extraction
// never follows one.
func validate(tr *tar.Reader, fn func(e entry, r io.Reader) error) error {
	c := checker{kind: map[string]byte{}, links: map[string]string{}}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return c.finish()
		}
		if err != nil {
			return err
		}
		e, skip, err := c.check(hdr)
		if err != nil {
			return err
		}
		if skip || fn == nil {
			continue
		}
		if err := fn(e, tr); err != nil {
			return err
		}
	}
}

type checker struct {
	kind  map[string]byte   // cleaned name -> tar.Type*, implicit parents as TypeDir
	links map[string]string // symlink name -> raw target
	order []string          // symlink names, for a deterministic finish
}

func unsafe(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsafePath, fmt.Sprintf(format, a...))
}

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadArchive, fmt.Sprintf(format, a...))
}

func (c *checker) check(h *tar.Header) (e entry, skip bool, err error) {
	switch h.Typeflag {
	case tar.TypeXGlobalHeader:
		return e, true, nil // PAX global metadata, not a file
	//lint:ignore SA1019 archives from old tools still mark files '\x00'
	case tar.TypeReg, tar.TypeRegA, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return e, false, unsafe("%q is a device or fifo", h.Name)
	default:
		return e, false, bad("%q has unsupported type %q", h.Name, h.Typeflag)
	}
	typ := h.Typeflag
	//lint:ignore SA1019 see above
	if typ == tar.TypeRegA {
		typ = tar.TypeReg
	}
	name, err := cleanMember(h.Name)
	if err != nil {
		return e, false, err
	}
	if name == "." {
		if typ != tar.TypeDir {
			return e, false, bad("root entry %q is not a directory", h.Name)
		}
		return e, true, nil
	}
	// Parents must be real directories: never a symlink (writing through it
	// could land anywhere) and never a file.
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		switch c.kind[p] {
		case tar.TypeSymlink:
			return e, false, unsafe("%q passes through symlink %q", h.Name, p)
		case 0, tar.TypeDir:
		default:
			return e, false, bad("%q has non-directory parent %q", h.Name, p)
		}
	}
	if prev, ok := c.kind[name]; ok && !(prev == tar.TypeDir && typ == tar.TypeDir) {
		if prev == tar.TypeSymlink || typ == tar.TypeSymlink {
			return e, false, unsafe("%q replaces an earlier entry with a symlink or through one", h.Name)
		}
		return e, false, bad("duplicate entry %q", h.Name)
	}
	e = entry{hdr: h, Name: name}
	switch typ {
	case tar.TypeSymlink:
		if h.Linkname == "" {
			return e, false, bad("symlink %q has no target", h.Name)
		}
		c.links[name] = h.Linkname
		if !path.IsAbs(h.Linkname) {
			c.order = append(c.order, name)
		}
	case tar.TypeLink:
		target, err := cleanMember(h.Linkname)
		if err != nil {
			return e, false, err
		}
		if k := c.kind[target]; k != tar.TypeReg && k != tar.TypeLink {
			return e, false, bad("hard link %q names %q, which is not an earlier file", h.Name, h.Linkname)
		}
		e.Linkname = target
	}
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		if _, ok := c.kind[p]; !ok {
			c.kind[p] = tar.TypeDir
		}
	}
	c.kind[name] = typ
	return e, false, nil
}

// cleanMember rejects absolute names and any ".." component outright
// (legitimate archives never need them), then cleans the name.
func cleanMember(name string) (string, error) {
	if name == "" {
		return "", bad("empty member name")
	}
	if strings.HasPrefix(name, "/") {
		return "", unsafe("%q is absolute", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", unsafe("%q contains '..'", name)
		}
	}
	return path.Clean(name), nil
}

// finish checks symlink targets once every link is known, since a later
// entry can change where an earlier target resolves.
func (c *checker) finish() error {
	for _, name := range c.order {
		if c.escapes(name) {
			return unsafe("symlink %q -> %q resolves outside the context", name, c.links[name])
		}
	}
	return nil
}

// maxHops bounds symlink expansion; a loop counts as unsafe.
const maxHops = 255

// escapes resolves the target of relative symlink name component by
// component, expanding the archive's symlinks the way the kernel would, and
// reports whether it ever climbs above the context root. Reaching an
// absolute symlink ends the walk inside: what follows is a path in the image.
func (c *checker) escapes(name string) bool {
	var stack []string
	if d := path.Dir(name); d != "." {
		stack = strings.Split(d, "/")
	}
	pending := strings.Split(c.links[name], "/")
	hops := 0
	for len(pending) > 0 {
		comp := pending[0]
		pending = pending[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return true
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, comp)
		t, ok := c.links[strings.Join(stack, "/")]
		if !ok {
			continue
		}
		if hops++; hops > maxHops {
			return true
		}
		if path.IsAbs(t) {
			return false
		}
		stack = stack[:len(stack)-1]
		pending = append(strings.Split(t, "/"), pending...)
	}
	return false
}
