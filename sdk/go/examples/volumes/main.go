// Volumes: create one, fill it without a sandbox, mount it read-only in a
// sandbox, and see that it cannot be deleted while mounted.
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
	name := fmt.Sprintf("example-%d", time.Now().UnixNano())
	v, err := c.CreateVolume(ctx, name, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteVolume(context.Background(), v.VolumeID)

	if _, err := v.WriteFile(ctx, "/dataset/readme.txt", strings.NewReader("shared data\n"), &cubicle.VolumeWriteOptions{Force: true}); err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, cubicle.CreateOptions{VolumeMounts: []cubicle.VolumeMount{{Name: name, Path: "/mnt/data", ReadOnly: true}}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := sb.Commands().Run(ctx, "cat /mnt/data/dataset/readme.txt", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print("in the sandbox: ", res.Stdout)

	if err := c.DeleteVolume(ctx, v.VolumeID); !errors.Is(err, cubicle.ErrVolumeInUse) {
		log.Fatalf("expected ErrVolumeInUse, got %v", err)
	}
	fmt.Println("delete refused while mounted")
	sb.Kill(ctx)
	if err := c.DeleteVolume(ctx, v.VolumeID); err != nil {
		log.Fatal(err)
	}
	if _, err := c.GetVolume(ctx, v.VolumeID); !errors.Is(err, cubicle.ErrVolumeNotFound) {
		log.Fatalf("expected ErrVolumeNotFound, got %v", err)
	}
	fmt.Println("volume deleted")
}
