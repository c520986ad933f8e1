module github.com/dynamo-ctx/dynamo-ctx/bench/muxcompare

go 1.26.0

replace github.com/dynamo-ctx/dynamo-ctx => ../..

require (
	github.com/dynamo-ctx/dynamo-ctx v0.0.0-00010101000000-000000000000
	github.com/hashicorp/yamux v0.1.2
	github.com/xtaci/smux v1.5.58
	google.golang.org/grpc v1.85.0
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
