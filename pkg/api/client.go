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
	"strings"

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

func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("agent at %s: /%s: %s: %s", c.Socket, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("agent at %s: /%s: %w", c.Socket, path, err)
	}
	return nil
}

// do sends a request to the agent's API at path.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, baseURL.JoinPath(path).String(), body)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent API at %s: %w (is l4xds-agent running? see --socket)", c.Socket, err)
	}
	return resp, nil
}
