package testutil

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Serve runs svcs on one real gRPC server on a loopback port until the
// test ends, and returns a client connection to it. The cleanup closes
// the connection, stops the server and waits for Serve to return, so no
// goroutine outlives the test (goleak).
func Serve(t testing.TB, svcs ...interface{ Register(grpc.ServiceRegistrar) }) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	for _, s := range svcs {
		s.Register(srv)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		<-served
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-served
	})
	return conn
}
