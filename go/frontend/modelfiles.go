package frontend

// A model directory that this frontend cannot read (it runs on another
// machine), or whose files here are not its workers' (text.go), is read from
// a worker that serves it: the worker serves
// "<namespace>.backend.model_files" next to its generate endpoint, with the
// same model card (go/modelcard) as its metadata, and answers
// {"files": [names]} with the named files of its model directory (only
// plain names of .json and .jinja files directly in it), each as items
// {"name", "data": <a piece of its text>} and then {"name", "end": true}
// (or {"name", "missing": true}).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// ModelFilesEndpoint is the endpoint (under the namespace) of the workers
// that serve their model directory's text files.
const ModelFilesEndpoint = "backend.model_files"

// fetchTimeout bounds reading a model's files from a worker; discoveryWait
// how long a new client waits for a worker that serves them.
const (
	fetchTimeout  = 60 * time.Second
	discoveryWait = 3 * time.Second
)

type filesRequest struct {
	Files []string `json:"files"`
}

type filesItem struct {
	Name    string `json:"name"`
	Data    string `json:"data"`
	End     bool   `json:"end"`
	Missing bool   `json:"missing"`
}

// fetchModel reads the text files of text id (textID) from a worker that
// serves them, whose card names the same text, and loads them if they have
// the checksum sum ("": any); path names them in messages.
func (f *Frontend) fetchModel(id, path, sum string) (*hfmodel.Model, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	base, err := f.modelFilesClient(ctx)
	if err != nil {
		return nil, err
	}
	c, err := base.Filtered(func(meta []byte) bool { return textID(parseMeta(meta)) == id })
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// The client may be new: its view of the instances fills within moments.
	wait, stop := context.WithTimeout(ctx, discoveryWait)
	defer stop()
	arrived := make(chan struct{})
	c.ArmInstances(func() { close(arrived) })
	select {
	case <-arrived:
	case <-wait.Done():
	}
	if c.NumInstances() == 0 {
		what := path
		if sum != "" {
			what += " with checksum " + sum
		}
		return nil, fmt.Errorf("no worker serves the files of %s on %s.%s", what, f.opts.Namespace, ModelFilesEndpoint)
	}
	payload, _ := json.Marshal(filesRequest{Files: hfmodel.TextFiles})
	s, err := c.Generate(payload, f.rt.NewContext("model-files"), plane.RoundRobin, 0)
	if err != nil {
		return nil, err
	}
	defer s.Kill() // a no-op once it ended
	files := hfmodel.Files{}
	done := map[string]bool{}
	for {
		raw, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the files of %s from a worker: %w", path, err)
		}
		var it filesItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, fmt.Errorf("reading the files of %s from a worker: %w", path, err)
		}
		if !wanted(it.Name) || done[it.Name] {
			return nil, fmt.Errorf("reading the files of %s from a worker: unexpected item for %q", path, it.Name)
		}
		switch {
		case it.Missing:
			done[it.Name] = true
		case it.End:
			done[it.Name] = true
			if files[it.Name] == nil {
				files[it.Name] = []byte{}
			}
		default:
			if int64(len(files[it.Name])+len(it.Data)) > hfmodel.Limit(it.Name) {
				return nil, fmt.Errorf("%s/%s: more than the %d bytes read", path, it.Name, hfmodel.Limit(it.Name))
			}
			files[it.Name] = append(files[it.Name], it.Data...)
		}
	}
	for name := range files {
		if !done[name] {
			return nil, fmt.Errorf("reading the files of %s from a worker: %s ended early", path, name)
		}
	}
	if got := modelcard.Checksum(files); sum != "" && got != sum {
		// Changed in place since the worker published its card.
		return nil, fmt.Errorf("the files of %s a worker serves (checksum %s) are not those of its card (%s)", path, got, sum)
	}
	return hfmodel.FromFiles(path, files)
}

func wanted(name string) bool {
	for _, n := range hfmodel.TextFiles {
		if n == name {
			return true
		}
	}
	return false
}

// modelFilesClient is the client of the workers' model_files endpoints,
// made on first use.
func (f *Frontend) modelFilesClient(ctx context.Context) (*plane.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.files != nil {
		return f.files, nil
	}
	c, err := f.rt.Client(ctx, f.opts.Namespace+"."+ModelFilesEndpoint)
	if err != nil {
		return nil, err
	}
	f.files = c
	return c, nil
}
