package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Channel names a kernel socket the client is connected to.
type Channel int

// The channels a Client uses. stdin is not connected: the client never
// allows input, so kernels answer input() with an error at once. The
// heartbeat is not used either; the kernel's owner watches the process.
const (
	Shell Channel = iota
	Control
	IOPub
)

func (c Channel) String() string {
	switch c {
	case Shell:
		return "shell"
	case Control:
		return "control"
	case IOPub:
		return "iopub"
	}
	return "channel(" + strconv.Itoa(int(c)) + ")"
}

// ErrClosed is returned by requests on a closed client.
var ErrClosed = errors.New("jupyter: client closed")

// sendTimeout bounds one send; a kernel that does not drain its socket for
// this long is stuck, and its owner decides what to do.
const sendTimeout = 10 * time.Second

// Received is a message and the channel it came on.
type Received struct {
	Channel Channel
	Msg     *Message
}

// Client is connected to one kernel: DEALER sockets to its shell and control
// ROUTERs and a SUB socket (all topics) to its iopub PUB. Replies and iopub
// messages are routed to the Subscription of the request they answer (their
// parent msg_id); messages nobody waits for are dropped. It is safe for
// concurrent use.
type Client struct {
	signer  Signer
	session string
	cancel  context.CancelFunc
	socks   [3]zmq4.Socket
	sendMu  [3]sync.Mutex

	mu     sync.Mutex
	subs   map[string]*Subscription
	closed bool
}

// Dial connects to the kernel described by info. It first waits, until ctx
// ends, for the kernel to listen on its ports, so it can be called right
// after the kernel process was started.
func Dial(ctx context.Context, info *ConnectionInfo) (*Client, error) {
	if info.SignatureScheme != "" && info.SignatureScheme != "hmac-sha256" {
		return nil, fmt.Errorf("jupyter: unsupported signature scheme %q", info.SignatureScheme)
	}
	ports := map[Channel]int{Shell: info.ShellPort, Control: info.ControlPort, IOPub: info.IOPubPort}
	for _, port := range ports {
		if err := waitListening(ctx, net.JoinHostPort(info.IP, strconv.Itoa(port))); err != nil {
			return nil, err
		}
	}
	sctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		signer:  NewSigner(info.Key),
		session: NewID(),
		cancel:  cancel,
		subs:    map[string]*Subscription{},
	}
	quiet := log.New(io.Discard, "", 0)
	opts := []zmq4.Option{zmq4.WithLogger(quiet), zmq4.WithTimeout(sendTimeout), zmq4.WithDialerMaxRetries(3), zmq4.WithDialerRetry(50 * time.Millisecond)}
	c.socks[Shell] = zmq4.NewDealer(sctx, opts...)
	c.socks[Control] = zmq4.NewDealer(sctx, opts...)
	c.socks[IOPub] = zmq4.NewSub(sctx, opts...)
	if err := c.socks[IOPub].SetOption(zmq4.OptionSubscribe, ""); err != nil {
		c.Close()
		return nil, err
	}
	for ch, port := range ports {
		if err := c.socks[ch].Dial(info.endpoint(port)); err != nil {
			c.Close()
			return nil, fmt.Errorf("jupyter: dial %s: %w", ch, err)
		}
	}
	for ch := range c.socks {
		go c.read(Channel(ch))
	}
	return c, nil
}

func waitListening(ctx context.Context, addr string) error {
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jupyter: kernel not listening on %s: %w", addr, context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Session is the session id the client stamps on its requests.
func (c *Client) Session() string { return c.session }

func (c *Client) read(ch Channel) {
	for {
		zm, err := c.socks[ch].Recv()
		if err != nil {
			return // closed
		}
		m, err := c.signer.Decode(zm.Frames)
		if err != nil {
			continue // unsigned or garbled: never act on it
		}
		c.mu.Lock()
		sub := c.subs[m.ParentHeader.MsgID]
		c.mu.Unlock()
		if sub != nil {
			sub.push(Received{Channel: ch, Msg: m})
		}
	}
}

// Request sends a msgType request with content on ch and returns the
// subscription that receives its replies and iopub messages. The
// subscription exists before the request is sent, so nothing is missed;
// the caller must Close it.
func (c *Client) Request(ch Channel, msgType string, content any) (*Subscription, error) {
	body, err := json.Marshal(content)
	if err != nil {
		return nil, err
	}
	m := &Message{Header: NewHeader(c.session, msgType), Content: body}
	frames, err := c.signer.Encode(m)
	if err != nil {
		return nil, err
	}
	sub := &Subscription{c: c, id: m.Header.MsgID, ready: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.subs[sub.id] = sub
	c.mu.Unlock()
	c.sendMu[ch].Lock()
	err = c.socks[ch].SendMulti(zmq4.NewMsgFrom(frames...))
	c.sendMu[ch].Unlock()
	if err != nil {
		sub.Close()
		return nil, fmt.Errorf("jupyter: send %s on %s: %w", msgType, ch, err)
	}
	return sub, nil
}

// Close disconnects from the kernel; the kernel itself is not affected.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	for _, s := range c.socks {
		if s != nil {
			_ = s.Close()
		}
	}
}

// Subscription receives the messages whose parent is one request. Its queue
// is unbounded so the socket readers never block on a slow consumer (a
// stalled reader would make the kernel's PUB socket drop output).
type Subscription struct {
	c     *Client
	id    string
	ready chan struct{}

	mu    sync.Mutex
	queue []Received
}

// ID is the msg_id of the request.
func (s *Subscription) ID() string { return s.id }

// Ready is signalled when messages are waiting; call Drain after it fires.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Drain returns the waiting messages in arrival order (per channel).
func (s *Subscription) Drain() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q
}

func (s *Subscription) push(r Received) {
	s.mu.Lock()
	s.queue = append(s.queue, r)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Close stops routing messages to s.
func (s *Subscription) Close() {
	s.c.mu.Lock()
	delete(s.c.subs, s.id)
	s.c.mu.Unlock()
}

// WaitReady returns once the kernel answers on shell and its iopub messages
// reach this client. A SUB socket joins a PUB asynchronously, so messages
// published before the subscription took effect are lost; jupyter_client
// solves this the same way, by repeating kernel_info_request until one of
// them is seen on iopub.
func (c *Client) WaitReady(ctx context.Context) error {
	for {
		sub, err := c.Request(Shell, "kernel_info_request", struct{}{})
		if err != nil {
			return err
		}
		var reply, iopub bool
		retry := time.NewTimer(500 * time.Millisecond)
		for !(reply && iopub) {
			select {
			case <-sub.Ready():
				for _, r := range sub.Drain() {
					switch r.Channel {
					case Shell:
						reply = reply || r.Msg.Header.MsgType == "kernel_info_reply"
					case IOPub:
						iopub = true
					}
				}
				continue
			case <-retry.C:
			case <-ctx.Done():
			}
			break
		}
		retry.Stop()
		sub.Close()
		if reply && iopub {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("jupyter: kernel not ready: %w", context.Cause(ctx))
		}
	}
}
