module github.com/ferry-dev/ferry/ferrysink/ferryrabbit

go 1.26.0

require (
	github.com/ferry-dev/ferry v0.1.0
	github.com/google/uuid v1.6.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.6 // indirect
