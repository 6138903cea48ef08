// Streaming: follow a command's output as it runs, feed it stdin, and drive
// an interactive terminal.
package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := cubicle.NewClient(cubicle.ConfigFromEnv())
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, cubicle.CreateOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(context.Background())

	// Output arrives line by line while the command runs.
	_, err = sb.Commands().Run(ctx, "for i in 1 2 3; do echo tick $i; sleep 0.2; done", &cubicle.CommandOptions{
		OnStdout: func(b []byte) { fmt.Printf("[stdout] %s", b) },
	})
	if err != nil {
		log.Fatal(err)
	}

	// A background process reading stdin.
	h, err := sb.Commands().Start(ctx, "tr a-z A-Z", &cubicle.CommandOptions{Stdin: true})
	if err != nil {
		log.Fatal(err)
	}
	h.SendStdin(ctx, []byte("shout this\n"))
	h.CloseStdin(ctx)
	res, err := h.Wait()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print("tr said: ", res.Stdout)

	// A terminal: type a command, wait for its answer.
	var mu sync.Mutex
	var screen bytes.Buffer
	pty, err := sb.PTY().Create(ctx, cubicle.PTYOptions{Cols: 100, Rows: 30, OnData: func(b []byte) {
		mu.Lock()
		screen.Write(b)
		mu.Unlock()
	}})
	if err != nil {
		log.Fatal(err)
	}
	pty.SendStdin(ctx, []byte("echo answer=$((40+2)); stty size\n"))
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		done := strings.Contains(screen.String(), "answer=42") && strings.Contains(screen.String(), "30 100")
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("terminal did not answer: %q", screen.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("terminal answered 42 on a 100x30 screen")
	pty.Kill(ctx)
}
