// Package jupyter speaks the Jupyter messaging protocol (v5.3) to a kernel
// over ZeroMQ: connection files, HMAC-SHA256 signed multipart messages, and a
// client for the shell, control and iopub channels. It knows nothing about
// code interpreters or HTTP; package interp builds on it.
package jupyter

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
)

// ConnectionInfo is a kernel connection file: where the kernel binds its
// sockets and the key that signs every message.
type ConnectionInfo struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	SignatureScheme string `json:"signature_scheme"`
	Key             string `json:"key"`
	KernelName      string `json:"kernel_name,omitempty"`
}

// NewConnectionInfo picks five free TCP ports on ip and a random 32-byte key.
// The ports are only free at the time of the call, as with jupyter_client:
// the kernel binds them moments later, and a kernel that loses that race
// fails to start rather than talking to a stranger (the key is secret).
func NewConnectionInfo(ip string) (*ConnectionInfo, error) {
	var ports [5]int
	// All five listeners are held open together so they get distinct ports.
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for i := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("jupyter: pick port: %w", err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &ConnectionInfo{
		Transport:       "tcp",
		IP:              ip,
		ShellPort:       ports[0],
		IOPubPort:       ports[1],
		StdinPort:       ports[2],
		ControlPort:     ports[3],
		HBPort:          ports[4],
		SignatureScheme: "hmac-sha256",
		Key:             hex.EncodeToString(key),
	}, nil
}

// WriteFile writes the connection file at path with mode 0600; it refuses to
// replace an existing file, so a planted symlink cannot redirect the key.
func (c *ConnectionInfo) WriteFile(path string) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}

func (c *ConnectionInfo) endpoint(port int) string {
	return c.Transport + "://" + net.JoinHostPort(c.IP, strconv.Itoa(port))
}
