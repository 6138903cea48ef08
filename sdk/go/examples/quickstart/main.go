// Quickstart: create a sandbox, run a command, move a file in and out, kill it.
//
//	export CUBICLE_API_URL=http://127.0.0.1:3000 CUBICLE_API_KEY=e2b_...
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
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
	sb, err := c.Create(ctx, cubicle.CreateOptions{Timeout: 5 * time.Minute, Metadata: map[string]string{"example": "quickstart"}})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(context.Background())
	fmt.Println("sandbox", sb.ID)

	res, err := sb.Commands().Run(ctx, "uname -s; echo hello from $(whoami)", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)

	// A non-zero exit is an error that still carries the output.
	_, err = sb.Commands().Run(ctx, "ls /nonexistent", nil)
	var exit *cubicle.CommandExitError
	if !errors.As(err, &exit) {
		log.Fatalf("expected a CommandExitError, got %v", err)
	}
	fmt.Println("ls exited with", exit.Result.ExitCode)

	if _, err := sb.Files().Write(ctx, "/home/user/notes.txt", strings.NewReader("written by the Go SDK\n"), nil); err != nil {
		log.Fatal(err)
	}
	b, err := sb.Files().ReadFile(ctx, "/home/user/notes.txt", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(b))
	if _, err := sb.Files().ReadFile(ctx, "/home/user/missing.txt", nil); !errors.Is(err, cubicle.ErrFileNotFound) {
		log.Fatalf("expected ErrFileNotFound, got %v", err)
	}
	if ok, err := sb.Kill(ctx); !ok || err != nil {
		log.Fatalf("kill: %v %v", ok, err)
	}
	fmt.Println("killed")
}
