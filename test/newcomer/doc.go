// Package newcomer plays the README's newcomer path: it starts Tollgate
// with `make run` (ARGS moving its ports off 8081 and 8080), then runs the
// commands of the README's examples, in order, with bash, curl and
// grpcurl, and checks what the README says each prints (issue 19).
package newcomer
