package interp

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent/interp/jupyter"
)

// Timing of an execution.
const (
	// keepaliveInterval: with nothing else to send for this long the
	// stream gets a keepalive line, so a client that vanished is noticed
	// by the failed write (and its execution interrupted).
	keepaliveInterval = 5 * time.Second
	// interruptRetry: ipykernel ignores SIGINT until the code runs, so an
	// interrupt that lands just before is repeated until one takes.
	interruptRetry = time.Second
	// interruptGrace: a kernel still busy this long after the first
	// interrupt is killed; the context's next execution gets a new one.
	interruptGrace = 10 * time.Second
	// silentTimeout bounds a helper execution (env vars, setup).
	silentTimeout = 30 * time.Second
)

// runOutcome is how an execution ended.
type runOutcome int

const (
	runDone       runOutcome = iota // the kernel went idle
	runKernelDied                   // the process ended mid-run
	runAbandoned                    // the client left; interrupted (or killed)
)

func executeRequest(code string, silent bool) map[string]any {
	return map[string]any{
		"code":             code,
		"silent":           silent,
		"store_history":    !silent,
		"user_expressions": map[string]any{},
		"allow_stdin":      false,
		"stop_on_error":    true,
	}
}

// execState turns one execution's kernel messages into stream lines.
type execState struct {
	emit    func(any) error
	errored bool // an error was sent; the kernel may report it twice
	idle    bool
	// replyErr is the execute_reply's error, sent at idle only if iopub
	// carried none: the reply comes on another socket, so it can overtake
	// the iopub error, and some kernels (jjava) put a bare stack in its
	// traceback.
	replyErr json.RawMessage
}

// handle converts r; a failed emit means the client is gone.
func (st *execState) handle(r jupyter.Received) error {
	m := r.Msg
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		if json.Unmarshal(m.Content, &c) != nil || (c.Name != "stdout" && c.Name != "stderr") {
			return nil
		}
		return st.emit(streamLine{Type: c.Name, Text: c.Text, Timestamp: timestamp(m.Header.Date)})
	case "execute_result", "display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return st.emit(newResult(m.Header.MsgType == "execute_result", c.Data))
	case "execute_input":
		var c struct {
			ExecutionCount int `json:"execution_count"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return st.emit(countLine{Type: "number_of_executions", ExecutionCount: c.ExecutionCount})
	case "error":
		return st.sendError(m.Content)
	case "execute_reply":
		var c struct{ Status string }
		_ = json.Unmarshal(m.Content, &c)
		switch c.Status {
		case "error":
			st.replyErr = m.Content
		case "abort", "aborted":
			return st.emit(newError("ExecutionAborted", "Execution was aborted", nil))
		}
	case "status":
		var c struct {
			ExecutionState string `json:"execution_state"`
		}
		if json.Unmarshal(m.Content, &c) == nil && c.ExecutionState == "idle" && r.Channel == jupyter.IOPub {
			st.idle = true
			if st.replyErr != nil {
				return st.sendError(st.replyErr)
			}
		}
	}
	return nil
}

func (st *execState) sendError(content json.RawMessage) error {
	if st.errored {
		return nil
	}
	var c struct {
		Ename     string   `json:"ename"`
		Evalue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	}
	if json.Unmarshal(content, &c) != nil {
		return nil
	}
	st.errored = true
	return st.emit(newError(c.Ename, c.Evalue, c.Traceback))
}

// run executes code and streams its output through emit until the kernel
// is idle again (end_of_execution is the caller's to send). When the kernel
// dies it sends the error and unexpected_end_of_execution lines; when ctx
// ends or emit fails (the client left) it interrupts the kernel and waits
// for it, so the context stays usable.
func (k *kernel) run(ctx context.Context, code string, emit func(any) error) runOutcome {
	sub, err := k.client.Request(jupyter.Shell, "execute_request", executeRequest(code, false))
	if err != nil {
		// A kernel that cannot take a request is of no further use.
		k.kill()
		<-k.done
		k.sendDied(emit)
		return runKernelDied
	}
	defer sub.Close()
	st := &execState{emit: emit}
	keep := time.NewTimer(keepaliveInterval)
	defer keep.Stop()
	for {
		select {
		case <-sub.Ready():
			for _, r := range sub.Drain() {
				if err := st.handle(r); err != nil {
					return k.abandon(sub, st)
				}
			}
			if st.idle {
				if k.spec.Deno {
					k.fence(ctx, sub, st)
				}
				return runDone
			}
			keep.Reset(keepaliveInterval)
		case <-keep.C:
			if err := emit(keepalive); err != nil {
				return k.abandon(sub, st)
			}
			keep.Reset(keepaliveInterval)
		case <-k.done:
			// Output sent before the death still counts.
			for _, r := range sub.Drain() {
				_ = st.handle(r)
			}
			k.sendDied(emit)
			return runKernelDied
		case <-ctx.Done():
			return k.abandon(sub, st)
		}
	}
}

func (k *kernel) sendDied(emit func(any) error) {
	msg := fmt.Sprintf("The %s kernel %s while running the code; its state (variables, imports) is lost. The next execution in this context starts a fresh kernel.", k.spec.Language, k.status)
	_ = emit(errorLine{Type: "error", Name: "UnexpectedEndOfExecution", Value: msg, Traceback: ""})
	_ = emit(unexpectedEndOfExecution)
}

// abandon interrupts the execution whose client left and waits for the
// kernel to be idle, discarding the rest of its output. A kernel that does
// not stop within interruptGrace is killed.
func (k *kernel) abandon(sub *jupyter.Subscription, st *execState) runOutcome {
	st.emit = func(any) error { return nil }
	k.interrupt()
	retry := time.NewTicker(interruptRetry)
	defer retry.Stop()
	grace := time.NewTimer(interruptGrace)
	defer grace.Stop()
	for {
		select {
		case <-sub.Ready():
			for _, r := range sub.Drain() {
				_ = st.handle(r)
			}
			if st.idle {
				return runAbandoned
			}
		case <-retry.C:
			// Once the kernel reported an error (KeyboardInterrupt) the
			// interrupt took; another could hit its cleanup instead.
			if !st.errored {
				k.interrupt()
			}
		case <-grace.C:
			k.kill()
			<-k.done
			return runAbandoned
		case <-k.done:
			return runAbandoned
		}
	}
}

// fence collects the messages of sub that the kernel publishes after its
// idle status. It runs an empty silent execution and waits for that one's
// idle: the kernel handles requests in order and publishes on one socket, so
// whatever the previous execution still had to publish comes first. Bounded
// by silentTimeout; a client that left only loses late output.
func (k *kernel) fence(ctx context.Context, sub *jupyter.Subscription, st *execState) {
	f, err := k.client.Request(jupyter.Shell, "execute_request", executeRequest("", true))
	if err != nil {
		return
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, silentTimeout)
	defer cancel()
	fenced := &execState{emit: func(any) error { return nil }}
	for !fenced.idle {
		select {
		case <-f.Ready():
			for _, r := range f.Drain() {
				_ = fenced.handle(r)
			}
		case <-k.done:
			fenced.idle = true
		case <-ctx.Done():
			fenced.idle = true
		}
	}
	for _, r := range sub.Drain() {
		if st.handle(r) != nil {
			return
		}
	}
}

// runSilent executes helper code without output reaching anyone (silent,
// not in history) and waits for the kernel's reply.
func (k *kernel) runSilent(ctx context.Context, code string) error {
	if code == "" {
		return nil
	}
	sub, err := k.client.Request(jupyter.Shell, "execute_request", executeRequest(code, true))
	if err != nil {
		return err
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(ctx, silentTimeout)
	defer cancel()
	for {
		select {
		case <-sub.Ready():
			for _, r := range sub.Drain() {
				if r.Channel != jupyter.Shell || r.Msg.Header.MsgType != "execute_reply" {
					continue
				}
				var c struct {
					Status string `json:"status"`
					Ename  string `json:"ename"`
					Evalue string `json:"evalue"`
				}
				_ = json.Unmarshal(r.Msg.Content, &c)
				if c.Status != "ok" {
					return fmt.Errorf("%w: %s %s: %s", ErrSilentRunFailed, c.Status, c.Ename, c.Evalue)
				}
				return nil
			}
		case <-k.done:
			return fmt.Errorf("%w: it %s", ErrKernelDied, k.status)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
