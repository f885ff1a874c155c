package extauthz

// Chat messages and their content parts: text, and images by detail.

// messages counts the content of each item of a chat's messages.
func (s *scanner[T]) messages() error {
	if s.data[s.i] != '[' {
		return s.skip(false)
	}
	return s.array(s.message)
}

func (s *scanner[T]) message() error {
	if s.data[s.i] != '{' {
		return s.skip(false)
	}
	return s.object(s.messageMember)
}

func (s *scanner[T]) messageMember(k token) error {
	name, err := s.field(k, messageKeys)
	switch {
	case err != nil:
		return err
	case name == "content":
		return s.content()
	case name == "tool_calls", name == "function_call":
		return s.toolCalls()
	}
	return s.skip(true)
}

// content counts a message's content: a string, or a list of parts whose
// text is counted.
func (s *scanner[T]) content() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.part)
	}
	return s.skip(false)
}

func (s *scanner[T]) part() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '{':
		return s.imageObject(s.partMember)
	}
	return s.skip(false)
}

// imageObject reads an object that may be an image part, and counts it
// if it is one.
func (s *scanner[T]) imageObject(member func(token) error) error {
	outer := s.image
	s.image = imagePart{detail: ImageAuto}
	err := s.object(member)
	if s.image.is {
		s.body.Images[s.image.detail]++
	}
	s.image = outer
	return err
}

// partMember reads a member of a content part: its text, or what makes
// it an image (chat's image_url object, the Responses API's input_image
// type, image_url string and detail).
func (s *scanner[T]) partMember(k token) error {
	name, err := s.field(k, partKeys)
	if err != nil {
		return err
	}
	return s.partField(name)
}

// partField reads a content part's member that field named ("" for
// none).
func (s *scanner[T]) partField(name string) error {
	switch name {
	case "text":
		return s.text()
	case "type":
		return s.partType()
	case "image_url":
		s.image.is = true
		if s.data[s.i] == '{' {
			return s.inObject(s.imageURLMember)
		}
	case "detail":
		return s.detail()
	}
	return s.skip(true)
}

func (s *scanner[T]) imageURLMember(k token) error {
	name, err := s.field(k, imageURLKeys)
	switch {
	case err != nil:
		return err
	case name == "detail":
		return s.detail()
	}
	return s.skip(true)
}

// partType marks a part whose type is an image's.
func (s *scanner[T]) partType() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	t, err := s.str()
	if err == nil && (s.is(t, "image_url") || s.is(t, "input_image")) {
		s.image.is = true
	}
	return err
}

// detail reads an image's detail.
func (s *scanner[T]) detail() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	t, err := s.str()
	switch {
	case err != nil:
	case s.is(t, "low"):
		s.image.detail = ImageLow
	case s.is(t, "high"):
		s.image.detail = ImageHigh
	default:
		s.image.detail = ImageAuto
	}
	return err
}

// text counts a string value and skips any other.
func (s *scanner[T]) text() error {
	if s.data[s.i] == '"' {
		return s.chars()
	}
	return s.skip(false)
}
