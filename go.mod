module github.com/dynamo-ctx/dynamo-ctx

go 1.24

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
