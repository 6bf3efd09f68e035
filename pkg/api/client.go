// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/statedb"
)

// Client talks to an agent's API socket.
type Client struct {
	Socket    string
	transport *http.Transport
	http      *http.Client
}

// baseURL is a placeholder host: the transport always dials the socket.
var baseURL = &url.URL{Scheme: "http", Host: "l4xds-agent"}

func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	return &Client{Socket: socket, transport: tr, http: &http.Client{Transport: tr}}
}

// RemoteTable returns a handle to read one of the agent's tables.
func RemoteTable[Obj any](c *Client, table string) *statedb.RemoteTable[Obj] {
	t := statedb.NewRemoteTable[Obj](baseURL.JoinPath("statedb"), table)
	t.SetTransport(c.transport)
	return t
}

// Shell runs one shell command line in the agent and copies its output to
// out as it comes.
func (c *Client) Shell(ctx context.Context, line string, out io.Writer) error {
	resp, err := c.do(ctx, http.MethodPost, "shell", strings.NewReader(line))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		return err
	}
	if msg := resp.Trailer.Get(ShellErrorTrailer); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// Health returns the agent's health report.
func (c *Client) Health(ctx context.Context) (HealthReport, error) {
	var rep HealthReport
	resp, err := c.do(ctx, http.MethodGet, "healthz", nil)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return rep, fmt.Errorf("agent at %s: /healthz: %w", c.Socket, err)
	}
	return rep, nil
}

// Config returns the agent's settings (/config).
func (c *Client) Config(ctx context.Context) (Settings, error) {
	var s Settings
	return s, c.getJSON(ctx, "config", &s)
}

// Table decodes every row of one of the agent's tables into rows, a pointer
// to a slice, in the order of the table's primary index.
func (c *Client) Table(ctx context.Context, table string, rows any) error {
	var dump map[string]json.RawMessage
	if err := c.getJSON(ctx, "statedb/dump/"+table, &dump); err != nil {
		return err
	}
	raw, ok := dump[table]
	if !ok {
		return fmt.Errorf("agent at %s has no table %q", c.Socket, table)
	}
	if err := json.Unmarshal(raw, rows); err != nil {
		return fmt.Errorf("agent at %s: table %s: %w", c.Socket, table, err)
	}
	return nil
}

// CPUProfile copies a CPU profile of the agent over d to w, in the format
// `go tool pprof` reads.
func (c *Client) CPUProfile(ctx context.Context, d time.Duration, w io.Writer) error {
	body, err := c.get(ctx, "debug/pprof/profile", "seconds="+strconv.Itoa(max(1, int(d.Seconds()))))
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(w, body)
	return err
}

func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	body, err := c.get(ctx, path, "")
	if err != nil {
		return err
	}
	defer body.Close()
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("agent at %s: /%s: %w", c.Socket, path, err)
	}
	return nil
}

// get GETs path with query and returns the body of a 200, or an error
// with the agent's message.
func (c *Client) get(ctx context.Context, path, query string) (io.ReadCloser, error) {
	u := baseURL.JoinPath(path)
	u.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("agent at %s: /%s: %s: %s", c.Socket, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return resp.Body, nil
}

// do sends a request to the agent's API at path.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, baseURL.JoinPath(path).String(), body)
	if err != nil {
		return nil, err
	}
	return c.send(req)
}

func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent API at %s: %w (is l4xds-agent running? see --socket)", c.Socket, err)
	}
	return resp, nil
}
