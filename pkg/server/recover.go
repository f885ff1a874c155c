package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errPanic is what a caller sees when a handler panics: the panic value
// and stack go to the log only.
var errPanic = status.Error(codes.Internal, "internal error")

func recoverUnary(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				logPanic(log, info.FullMethod, r)
				resp, err = nil, errPanic
			}
		}()
		return handler(ctx, req)
	}
}

func recoverStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				logPanic(log, info.FullMethod, r)
				err = errPanic
			}
		}()
		return handler(srv, ss)
	}
}

func logPanic(log *zap.Logger, method string, r any) {
	log.Error("handler panicked", zap.String("method", method), zap.Any("panic", r), zap.Stack("stack"))
}
