module github.com/ferry-dev/ferry/ferrysink/ferryrabbit

go 1.26.8

replace github.com/ferry-dev/ferry => ../..

require (
	github.com/ferry-dev/ferry v0.0.0
	github.com/google/uuid v1.6.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.6 // indirect
