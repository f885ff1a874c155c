package app

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate-dev/tollgate/pkg/config"
	"github.com/tollgate-dev/tollgate/pkg/store/memstore"
	"github.com/tollgate-dev/tollgate/pkg/store/redisstore"
	"github.com/tollgate-dev/tollgate/pkg/ticket"
	"github.com/tollgate-dev/tollgate/test/redistest"
)

func keyLine(b byte) string {
	return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(rune(b)), ticket.MinKeyBytes)))
}

// TestTicketKeyFileRotation: a rotation written to the key file (the new
// key first, the old one after it) is served without a restart: tickets
// sealed before it still open, new ones are sealed with the new key; a
// file that stops loading keeps the keys in force.
func TestTicketKeyFileRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "ticket-keys")
	writeFile(t, path, keyLine('a')+"\n")
	reloads := make(chan bool, 10)
	ready := make(chan struct{})
	f := ticketFlags{keyFile: path, hooks: &config.WatchHooks{Ready: func() { close(ready) }, Reloaded: func(changed bool) { reloads <- changed }}}
	keys, keep, err := f.ticketKeys(context.Background(), memstore.New(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ticket.NewSealer(keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); keep(ctx, s) }()
	t.Cleanup(func() { cancel(); <-done })
	<-ready
	<-reloads // the load Watch makes once its watches are in place

	now := time.Now()
	before := s.Seal(&ticket.Ticket{ID: "old", Domain: "d", At: now})
	next := func(what string) {
		t.Helper()
		select {
		case changed := <-reloads:
			if !changed {
				t.Fatalf("%s: the watcher saw no change", what)
			}
		case <-time.After(wait):
			t.Fatalf("%s: no reload within %v", what, wait)
		}
	}
	writeFile(t, path, keyLine('b')+"\n"+keyLine('a')+"\n")
	next("rotation")
	if _, err := s.Open(before, now); err != nil {
		t.Errorf("a ticket sealed before the rotation: %v", err)
	}
	onlyB, err := ticket.ParseKeys("b", []byte(keyLine('b')))
	if err != nil {
		t.Fatal(err)
	}
	nb, _ := ticket.NewSealer(onlyB, 0)
	if _, err := nb.Open(s.Seal(&ticket.Ticket{ID: "new", Domain: "d", At: now}), now); err != nil {
		t.Errorf("a ticket sealed after the rotation does not open under the new key: %v", err)
	}
	// The previous key retired, the current one kept: same ID, other keys.
	writeFile(t, path, keyLine('b')+"\n"+keyLine('c')+"\n")
	next("the previous key replaced")
	if _, err := s.Open(before, now); !errors.Is(err, ticket.ErrForged) {
		t.Errorf("a ticket of the retired key: %v, want refused", err)
	}
	held := s.Keys()
	writeFile(t, path, "short\n")
	next("a bad file")
	if s.Keys() != held {
		t.Errorf("a bad key file changed the keys in force")
	}
}

// TestTicketKeyFileErrors: serve refuses to start on a bad key file,
// naming file and line and never quoting the line.
func TestTicketKeyFileErrors(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ticket-keys")
	short := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))
	writeFile(t, path, "# keys\n"+short+"\n")
	_, _, err := ticketFlags{keyFile: path}.ticketKeys(context.Background(), memstore.New(), zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), path+":2: key is 16 bytes") || strings.Contains(err.Error(), short) {
		t.Errorf("ticketKeys = %v, want %s:2 and no key in the message", err, path)
	}
	var missing *os.PathError
	if _, _, err := (ticketFlags{keyFile: path + ".none"}).ticketKeys(context.Background(), memstore.New(), zap.NewNop()); !errors.As(err, &missing) {
		t.Errorf("a missing file: %v", err)
	}
}

// TestTicketKeySharedThroughRedis: without a key file, replicas on one
// Redis seal with the same key, so a ticket from one opens on another.
func TestTicketKeySharedThroughRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	sealer := func() *ticket.Sealer {
		c, err := redisstore.NewClient(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		st := redisstore.New(c)
		t.Cleanup(func() { _ = st.Close() })
		keys, _, err := ticketFlags{}.ticketKeys(context.Background(), st, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ticket.NewSealer(keys, 0)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := sealer(), sealer()
	now := time.Now()
	if _, err := b.Open(a.Seal(&ticket.Ticket{ID: "x", Domain: "d", At: now}), now); err != nil {
		t.Errorf("B opens A's ticket: %v", err)
	}
	// On memstore, each process has its own key.
	m1, _, _ := ticketFlags{}.ticketKeys(context.Background(), memstore.New(), zap.NewNop())
	m2, _, _ := ticketFlags{}.ticketKeys(context.Background(), memstore.New(), zap.NewNop())
	if m1.ID() == m2.ID() {
		t.Error("two memstore processes share a key")
	}
}
