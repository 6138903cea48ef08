// Template: build a template from a Dockerfile-style recipe with a file
// from a local context, following the build log, then start a sandbox
// from it.
//
//	go run ./examples/template -from-template base
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

func main() {
	fromImage := flag.String("from-image", "", "base OCI image (as imported with `cubicle image import`)")
	fromTemplate := flag.String("from-template", "base", "base template (when -from-image is empty)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := cubicle.NewClient(cubicle.ConfigFromEnv())
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cubicle-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "app.sh"), []byte("#!/bin/sh\necho app says hi\n"), 0o755)

	from := "template:" + *fromTemplate
	if *fromImage != "" {
		from = *fromImage
	}
	// A Dockerfile-style recipe; TemplateSpec{Steps: ...} works as well.
	rec, err := cubicle.ParseRecipe("Recipe", "FROM "+from+`
COPY app.sh /opt/app/app.sh
RUN echo built at $(date +%s) > /opt/app/stamp
CMD ["sleep", "infinity"]
`)
	if err != nil {
		log.Fatal(err)
	}
	spec := rec.Spec(fmt.Sprintf("example-%d", time.Now().Unix()), dir)
	ref, err := c.BuildTemplate(ctx, spec, &cubicle.BuildOptions{
		OnCreated: func(r cubicle.TemplateBuildRef) { fmt.Println("template", r.TemplateID, "build", r.BuildID) },
		OnUpload: func(u cubicle.UploadProgress) {
			if u.Done {
				fmt.Printf("context %s: cached=%v %d bytes\n", u.Src, u.Cached, u.Total)
			}
		},
		OnLog: func(e cubicle.BuildLogEntry) { fmt.Printf("[%s] %s\n", e.Step, e.Message) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteTemplate(context.Background(), ref.TemplateID, true)
	sb, err := c.Create(ctx, cubicle.CreateOptions{Template: spec.Name})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(context.Background())
	res, err := sb.Commands().Run(ctx, "/opt/app/app.sh && cat /opt/app/stamp", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}
