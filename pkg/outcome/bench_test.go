package outcome

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// BenchmarkReportDebugOff is a report of a ticket already settled, with
// the log at info level: what every report pays for the settlement
// debug line while debug is off. Report checks the level before it
// builds the line's fields; logging through Logger.Debug instead costs
// one more allocation and about 470 more bytes a report here.
func BenchmarkReportDebugOff(b *testing.B) {
	core, _ := observer.New(zap.InfoLevel)
	l, _, _ := newTestLoop(b, &fakeLimiter{done: true, rules: rules(b)}, zap.New(core))
	tk := reservedTicket()
	ctx := context.Background()
	l.Report(ctx, ChannelAccessLog, tk, Usage{Total: 300, Reported: true})
	b.ReportAllocs()
	for b.Loop() {
		l.Report(ctx, ChannelAccessLog, tk, Usage{Total: 300, Reported: true})
	}
}
