package events

// DecodeLarge is decodeLarge, for the tests of package events_test.
var DecodeLarge = decodeLarge
